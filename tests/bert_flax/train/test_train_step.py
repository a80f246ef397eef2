"""The pure train step bound by hand equals the setup's sharded, donated one; the loop checks its
first batch against the contract."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax import sharding
from bert_flax.input_pipeline.synthetic import random_batch
from bert_flax.model import bert as bert_model
from bert_flax.model import losses
from bert_flax.tasks.pretraining import task as pretraining
from bert_flax.train import loop
from bert_flax.train import step as train_step
from bert_flax.train.setup import PRNG_IMPLS, create_train_setup, dropout_key


@pytest.mark.slow(seconds=30)
def test_pure_step_bound_with_partial_equals_the_setups(make_config):
    config = make_config()
    config.schedule.warmup_steps = 0
    setup = create_train_setup(config)
    batch = random_batch(config.train.batch_size, setup.task.row_shape, vocab_size=512, seed=3)
    rng = jax.random.key(7)
    step = jax.jit(
        functools.partial(
            train_step.train_step,
            model=setup.model,
            tx=setup.tx,
            learning_rate=setup.learning_rate,
            objective=losses.pretraining_objective(config.train.mlm_normalization),
        )
    )
    by_hand, by_hand_metrics = jax.device_get(step(setup.state, batch, rng))
    initial = jax.device_get(setup.state.params)
    state, metrics = setup.train_step(setup.state, sharding.global_batch(setup.mesh, batch), rng)
    state, metrics = jax.device_get((state, metrics))
    assert int(state.step) == int(by_hand.step) == 1
    assert metrics["loss"] == pytest.approx(float(by_hand_metrics["loss"]), rel=1e-6)
    moved = jax.tree.map(lambda a, b: np.max(np.abs(a - b)), initial, state.params)
    assert max(jax.tree.leaves(moved)) > 1e-4
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), by_hand.params, state.params
    )
    evaluated, outputs = train_step.eval_step(
        state.params, batch, model=setup.model, objective=losses.pretraining_objective()
    )
    assert outputs == {}  # pre-training is judged by its summed metrics alone
    jitted, _ = setup.eval_step(state.params, sharding.global_batch(setup.mesh, batch))
    assert float(jitted["masked_lm_accuracy/count"]) == float(batch["masked_lm_weights"].sum())
    for name, value in evaluated.items():
        assert float(jitted[name]) == pytest.approx(float(value), rel=1e-5), name


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_a_scanned_step_equals_the_unrolled_step(make_config, optimizer):
    """The same initial weights, stacked: after two LAMB (layer-wise trust ratios) or AdamW
    steps, the same parameters and loss (without dropout: the scan draws each layer's keys
    its own way)."""

    def two_steps(scan):
        config = make_config()
        config.schedule.warmup_steps = 0
        config.optimizer.name = optimizer
        config.model.update(scan_layers=scan, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
        setup = create_train_setup(config)
        batch = random_batch(config.train.batch_size, setup.task.row_shape, vocab_size=512, seed=3)
        batch = sharding.global_batch(setup.mesh, batch)
        state = setup.state
        if scan:  # start from the unrolled run's initial weights
            stacked = bert_model.stack_layers(two_steps.initial)
            state = state.replace(params=jax.device_put(stacked, setup.state_shardings.params))
            state = state.replace(opt_state=setup.tx.init(state.params))
        else:
            two_steps.initial = jax.device_get(state.params)  # the step donates the state
        for step in range(2):
            state, metrics = setup.train_step(state, batch, jax.random.key(step))
        return jax.device_get(state.params), float(metrics["loss"])

    plain, plain_loss = two_steps(False)
    scanned, scanned_loss = two_steps(True)
    assert scanned_loss == pytest.approx(plain_loss, rel=1e-5)
    # Within float32 summation order (the steps themselves are about 1e-2 of the learning rate).
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
        plain,
        bert_model.unstack_layers(scanned),
    )


def test_the_loop_checks_its_first_batch(make_config, tmp_path, monkeypatch):
    real = pretraining.train_iterator

    def corrupted(*args, **kwargs):
        for batch in real(*args, **kwargs):
            batch["input_ids"][0, 0] = 10_000  # beyond the 512-word vocabulary
            yield batch

    monkeypatch.setattr(pretraining, "train_iterator", corrupted)
    with pytest.raises(ValueError, match=r"input_ids spans \[\d+, 10000\], outside \[0, 512\)"):
        loop.train_and_evaluate(make_config(), str(tmp_path))


class _TwoLayers(nn.Module):
    """Two dropout sites under different module paths, as two BERT layers' are."""

    @nn.compact
    def __call__(self, x):
        return [nn.Dropout(0.1, name=f"layer_{i}")(x, deterministic=False) for i in range(2)]


@pytest.mark.parametrize("prng_impl", list(PRNG_IMPLS))
def test_dropout_keys_give_independent_masks_across_layers_and_steps(prng_impl):
    """For every generator: a step's key repeats (resuming), threefry's is the key every run
    before `prng_impl` used, and the masks of two layers and of two steps keep 90% and agree
    as independent masks do (0.9^2 + 0.1^2 = 0.82)."""
    ones = jnp.ones(20_000)

    def masks(step):
        key = dropout_key(seed=4, step=step, prng_impl=prng_impl)
        return [np.asarray(m != 0) for m in _TwoLayers().apply({}, ones, rngs={"dropout": key})]

    (a0, a1), (b0, _) = masks(0), masks(1)
    np.testing.assert_array_equal(masks(0)[0], a0)
    for mask in (a0, a1, b0):
        assert abs(mask.mean() - 0.9) < 0.01
    for x, y in ((a0, a1), (a0, b0)):
        assert abs((x == y).mean() - 0.82) < 0.015
    if prng_impl == "threefry":
        before = jax.random.fold_in(jax.random.fold_in(jax.random.key(4), 1), 0)
        np.testing.assert_array_equal(
            jax.random.key_data(dropout_key(4, 0)), jax.random.key_data(before)
        )
