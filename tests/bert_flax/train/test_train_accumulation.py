"""Gradient accumulation over m micro-batches equals one step on the whole batch."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bert_flax import sharding
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.synthetic import random_batch
from bert_flax.train.setup import create_train_setup

ROWS, MICRO_BATCHES = 16, 4


def one_step(config, batch):
    setup = create_train_setup(config)
    state, metrics = setup.train_step(
        setup.state, sharding.global_batch(setup.mesh, batch), jax.random.key(0)
    )
    return jax.device_get(state.params), jax.device_get(metrics)


@pytest.mark.slow(seconds=30)
def test_accumulation_equals_full_batch(make_config):
    batch = random_batch(ROWS, RowShape(32, 3, 8), vocab_size=512, seed=1)
    # Micro-batch j holds rows j, j + m, ...: their sequence counts differ, so a plain mean of
    # micro-batch losses would not be the full-batch loss; the test can tell them apart.
    per_micro = batch["sequence_mask"].reshape(ROWS // MICRO_BATCHES, MICRO_BATCHES, -1).sum((0, 2))
    assert len(set(per_micro.tolist())) > 1, per_micro

    results = {}
    for m in (1, MICRO_BATCHES):
        config = make_config(**{"train.batch_size": ROWS, "train.accumulation": m})
        config.schedule.warmup_steps = 0
        results[m] = one_step(config, batch)
    (full_params, full), (acc_params, acc) = results[1], results[MICRO_BATCHES]

    assert acc["loss"] == pytest.approx(full["loss"], rel=1e-5)
    for name in ("mlm_loss/sum", "mlm_loss/count", "nsp_loss/count", "sequences"):
        assert acc[name] == pytest.approx(full[name], rel=1e-5), name
    assert acc["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
    diffs = jax.tree_util.tree_map(lambda a, b: np.max(np.abs(a - b)), full_params, acc_params)
    assert max(jax.tree_util.tree_leaves(diffs)) < 1e-5
