"""A few dozen steps of the tiny packed BERT on real prepared text clearly reduce the MLM loss."""

from __future__ import annotations

import numpy as np
import pytest

from bert_flax import train
from bert_flax.metrics import read_metrics

STEPS = 40


@pytest.mark.slow
def test_tiny_bert_learns(make_config, small_data_dir, tmp_path):
    config = make_config(small_data_dir, **{"train.steps": STEPS, "train.batch_size": 16})
    config.optimizer.name = "adamw"
    config.schedule.learning_rate = 5e-2
    config.schedule.warmup_steps = 5
    config.checkpoint.enabled = False
    config.eval.every_steps = STEPS
    config.eval.num_batches = 4
    final = train.train_and_evaluate(config, str(tmp_path))

    train_records = read_metrics(str(tmp_path))["train"]
    first = train_records[0]["mlm_loss"]  # ~ln(30522) = 10.3 for an untrained model
    last = np.mean([r["mlm_loss"] for r in train_records[-5:]])
    assert first > 9.5
    assert last < first - 2.5, (first, last)
    # Held-out data: the loss is far below chance (ln V); packed rows: more sequences than rows.
    assert final["eval"]["mlm_loss"] < first - 2.5
    assert final["sequences_seen"] > STEPS * 16
    # The summary names the trivial predictor its baseline figure is for.
    assert final["baseline_name"].startswith("always predicting token")
    assert 0 < final["baseline"] < 1
