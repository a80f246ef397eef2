"""Configs that cannot run fail at start, before any compilation, with a message saying why."""

from __future__ import annotations

import os
import shutil
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh

import packing
from bert_flax import sharding
from bert_flax.model import attention
from bert_flax.train.setup import (
    adjust_for_packing,
    check_batch_fits,
    create_train_program,
    create_train_setup,
    learning_rate_schedule,
)
from optim.masks import weight_decay_mask


def abstract_mesh(data=1, fsdp=1, model=1):
    return AbstractMesh((data, fsdp, model), ("data", "fsdp", "model"))


def test_batch_not_divisible_by_data_axes():
    with pytest.raises(ValueError, match=r"not divisible by the 8 data-parallel shards"):
        check_batch_fits(abstract_mesh(data=4, fsdp=2), 12, 1)
    with pytest.raises(ValueError, match=r"micro-batch of 6 rows.*multiple of 8"):
        check_batch_fits(abstract_mesh(data=4), 12, 2)
    with pytest.raises(ValueError, match="not divisible by accumulation 5"):
        check_batch_fits(abstract_mesh(), 12, 5)
    assert check_batch_fits(abstract_mesh(data=4, model=2), 16, 2) == 8


@pytest.mark.parametrize(
    ("heads", "length", "mesh", "message"),
    [
        (2, 128, {"data": 1, "model": 4}, r"num_heads=2 is not divisible by its 4 devices"),
        (4, 64, {"data": 4, "model": 1}, r"multiple of 128, got 64.*max_seq_length"),
    ],
)
def test_splash_that_cannot_run_on_the_mesh_fails_at_configuration(heads, length, mesh, message):
    with pytest.raises(ValueError, match=message):
        attention.check_backend("splash", heads, length, mesh)
    attention.check_backend("xla", heads, length, mesh)  # the dense back-end runs anywhere


def test_mesh_larger_than_devices(make_config):
    config = make_config()
    config.mesh.shape = (16, 1, 1)
    with pytest.raises(ValueError, match=r"needs 16 devices.*xla_force_host_platform_device_count"):
        create_train_setup(config)


@pytest.mark.parametrize(
    ("shape", "axes", "message"),
    [
        ((2, 1), ("data", "fsdp", "model"), "differ in length"),
        ((-1, -1, 1), ("data", "fsdp", "model"), "at most one -1"),
        ((1, 1, 1), ("data", "tensor", "model"), "distinct names among"),
        ((3, -1, 1), ("data", "fsdp", "model"), "needs 3 devices"),
    ],
)
def test_bad_mesh_shapes(shape, axes, message):
    with pytest.raises(ValueError, match=message):
        sharding.resolve_mesh_shape(shape, axes, num_devices=8)


def test_mesh_shape_fills_in_minus_one():
    assert sharding.resolve_mesh_shape((-1, 2, 1), ("data", "fsdp", "model"), 8) == (4, 2, 1)


def test_missing_data(make_config, tmp_path):
    config = make_config()
    config.data.synthetic = False
    with pytest.raises(ValueError, match=r"data_dir is empty.*create_pretraining_data"):
        create_train_setup(config)
    config.data.data_dir = str(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"summary\.json not found"):
        create_train_setup(config)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("train.dtype", "float16", "dtype='float16' is not one of"),
        ("train.packing_hparams", "double", "packing_hparams='double'"),
        ("train.steps", 0, "steps=0 must be positive"),
        ("train.min_rows_per_step", 0, r"min_rows_per_step=0 must be >= 1"),
        ("train.prng_impl", "philox", "prng_impl='philox' is not one of"),
        ("eval.every_steps", 0, "every_steps=0 must be positive"),
        ("schedule.warmup_steps", 10, "warmup_steps=10, total_steps=4"),
        ("model.preset", "huge", "Unknown BERT preset 'huge'"),
    ],
)
def test_bad_values(make_config, key, value, message):
    with pytest.raises(ValueError, match=message):
        create_train_setup(make_config(**{key: value}))


def test_unknown_optimizer(make_config):
    config = make_config()
    config.optimizer.name = "adagrad"
    with pytest.raises(ValueError, match="Unknown optimizer 'adagrad'"):
        create_train_setup(config)


def test_schedule_warmup_then_polynomial_decay(make_config):
    schedule = make_config().schedule
    schedule.learning_rate, schedule.warmup_steps, schedule.decay_power = 1.0, 10, 2.0
    lr = learning_rate_schedule(schedule, 110, schedule.warmup_steps)
    assert [float(lr(s)) for s in (0, 5, 10)] == pytest.approx([0.0, 0.5, 1.0])
    assert float(lr(60)) == pytest.approx(0.25)  # (1 - 50/100) ** 2
    assert float(lr(110)) == pytest.approx(0.0)
    schedule.step_offset, schedule.total_steps = 100, 110
    shifted = learning_rate_schedule(schedule, 210, schedule.warmup_steps)
    assert float(shifted(105)) == pytest.approx(0.5) and float(shifted(50)) == 0.0


def test_packing_adjustments(make_config):
    config = make_config(**{"train.batch_size": 64, "train.accumulation": 8})
    config.train.packing_hparams = "divide_accumulation"
    a = adjust_for_packing(config, 2.0)
    assert (a.batch_size, a.accumulation, a.b1) == (32, 4, 0.9)
    config.train.accumulation = 1
    assert adjust_for_packing(config, 2.0, row_multiple=8).batch_size == 32
    config.train.packing_hparams = "raise_betas"
    a = adjust_for_packing(config, 2.0)
    assert (a.batch_size, a.accumulation) == (64, 1)
    assert (a.b1, a.b2) == pytest.approx((0.81, 0.999**2))
    config.train.packing_hparams = "none"
    assert adjust_for_packing(config, 2.0).b1 == 0.9


def test_min_rows_per_step_scales_betas_and_learning_rate_by_the_extra_sequences(make_config):
    config = make_config(**{"train.batch_size": 32, "train.min_rows_per_step": 8})
    config.train.packing_hparams = "divide_accumulation"
    a = adjust_for_packing(config, 2.0)  # 16 rows: above the floor, nothing changes
    assert (a.batch_size, a.b1, a.learning_rate_scale) == (16, 0.9, 1.0)
    a = adjust_for_packing(config, 8.0)  # 4 rows raised to 8: twice the sequences per step
    assert a.batch_size == 8
    assert (a.b1, a.b2) == pytest.approx((0.9**2, 0.999**2))
    assert a.learning_rate_scale == pytest.approx(2**0.5)
    config.train.batch_size, config.train.accumulation = 64, 16  # micro-batches of 4 rows
    a = adjust_for_packing(config, 8.0)  # 2 micro-batches raised to 2 (8 rows): no change
    assert (a.batch_size, a.accumulation, a.learning_rate_scale) == (8, 2, 1.0)
    a = adjust_for_packing(config, 16.0)  # 1 micro-batch raised to 2
    assert (a.batch_size, a.accumulation) == (8, 2)
    assert a.learning_rate_scale == pytest.approx(2**0.5)
    config.schedule.warmup_steps, config.schedule.end_learning_rate = 10, 1e-4
    schedule = learning_rate_schedule(config.schedule, 100, 10, scale=2.0)
    assert float(schedule(10)) == pytest.approx(2 * config.schedule.learning_rate)
    assert float(schedule(100)) == pytest.approx(2e-4)


@pytest.mark.parametrize(
    ("sections", "packing_factor", "power"),
    [
        ({"train.packing_hparams": "raise_betas"}, 2.0, 2),  # 8 rows of 2 sequences
        (  # 32 rows / 8 = 4, raised to the floor of 8: twice the sequences, lr times sqrt(2)
            {"train.packing_hparams": "divide_accumulation", "train.batch_size": 32,
             "train.min_rows_per_step": 8},
            8.0,
            2,
        ),
    ],
    ids=["raise_betas", "divide_accumulation_floor"],
)  # fmt: skip
def test_the_adjusted_betas_and_learning_rate_reach_the_optimizer(
    make_config, sections, packing_factor, power
):
    """The run's optimizer takes two steps as optax's LAMB with the config's betas to the power
    r (`power`) and, where divide_accumulation's floor adds sequences, the warm-up to the peak
    rate times sqrt(r). Two steps: Adam's bias correction makes the first the same for any betas."""
    config = make_config(**{"train.grad_clip_norm": 0.0, **sections})
    program = create_train_program(config, packing_factor_override=packing_factor)
    lamb, schedule = config.optimizer.lamb, config.schedule
    scale = power**0.5 if sections["train.packing_hparams"] == "divide_accumulation" else 1.0
    rng = np.random.default_rng(0)
    params = {"layer": {"kernel": jnp.asarray(rng.normal(size=(4, 3))), "bias": jnp.zeros(3)}}
    grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape)), params) for _ in "12"]

    def lamb_with(b1: float, b2: float) -> optax.GradientTransformation:
        warmup = optax.linear_schedule(0.0, schedule.learning_rate * scale, schedule.warmup_steps)
        return optax.lamb(
            warmup, b1, b2, eps=lamb.eps, weight_decay=lamb.weight_decay, mask=weight_decay_mask
        )

    def two_steps(tx: optax.GradientTransformation) -> dict:
        p, state = params, tx.init(params)
        for g in grads:
            updates, state = tx.update(g, state, p)
            p = optax.apply_updates(p, updates)
        return p

    assert schedule.warmup_steps >= 2  # both steps in the warm-up, which the reference has
    expected = two_steps(lamb_with(lamb.b1**power, lamb.b2**power))
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-6), two_steps(program.tx), expected)
    unadjusted = two_steps(lamb_with(lamb.b1, lamb.b2))["layer"]["kernel"]
    assert not np.allclose(unadjusted, expected["layer"]["kernel"], rtol=1e-3)  # betas show


def test_raise_betas_works_for_any_optimizer_with_betas(make_config):
    config = make_config(**{"train.packing_hparams": "raise_betas"})
    for name in ("lamb", "adamw", "shampoo"):
        config.optimizer.name = name
        assert adjust_for_packing(config, 2.0).b1 == pytest.approx(0.81)
    config.optimizer.name = "soap"  # Adam's betas in the rotated basis, 0.95 by default
    assert adjust_for_packing(config, 2.0).b1 == pytest.approx(0.95**2)
    config.optimizer.name = "sgd"
    with pytest.raises(
        ValueError, match=r"optimizer 'sgd' has none.*\['adamw', 'lamb', 'shampoo', 'soap'\]"
    ):
        adjust_for_packing(config, 2.0)


def test_unknown_packing_algorithm(make_config):
    with pytest.raises(ValueError, match=r"config\.data\.algorithm='best' is not one of"):
        create_train_setup(make_config(**{"data.algorithm": "best"}))


@pytest.mark.parametrize("algorithm", ["spfhp", "lpfhp"])
def test_missing_strategies_are_solved_with_the_configured_algorithm(
    make_config, small_data_dir, tmp_path, algorithm
):
    data_dir = tmp_path / "data"
    shutil.copytree(small_data_dir, data_dir)
    (data_dir / "strategies.json").unlink()
    setup = create_train_setup(make_config(str(data_dir), **{"data.algorithm": algorithm}))
    solved = packing.StrategySet.load(str(data_dir / "strategies.json"))
    assert solved.algorithm == algorithm
    assert setup.adjustment.packing_factor == pytest.approx(solved.metrics().packing_factor)


def test_an_empty_validation_split_stops_the_run_before_its_first_step(make_config, tmp_path):
    """Data prepared without validation documents: an error that says why, not one at the first
    evaluation asking for a smaller eval batch, and nothing written to the workdir."""
    from bert_flax.data import corpus
    from bert_flax.data.create_pretraining_data import (
        PretrainingDataOptions,
        create_pretraining_data,
    )
    from bert_flax.train.loop import train_and_evaluate

    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in sorted(os.listdir(corpus.bundled_corpus_dir()))[-2:]:
        shutil.copy(os.path.join(corpus.bundled_corpus_dir(), name), folder)
    data_dir = str(tmp_path / "data")
    options = PretrainingDataOptions(
        input=str(folder),
        output_dir=data_dir,
        max_seq_length=64,
        dupe_factor=1,
        validation_fraction=0.0,
        num_workers=1,
    )
    create_pretraining_data(options, progress=False)
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"'validation' split of .* holds no examples \(0 doc"):
        train_and_evaluate(make_config(data_dir), str(workdir))
    assert not workdir.exists() or not os.listdir(workdir)
