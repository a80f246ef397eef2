"""A few dozen steps of the tiny packed BERT on real prepared text clearly reduce the MLM loss."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bert_flax.runs.metrics import read_metrics
from bert_flax.train import loop

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
    final = loop.train_and_evaluate(config, str(tmp_path))

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
    # Compiling the step is not training: the first logged interval's seconds leave it out.
    first_interval = train_records[0]["step_seconds"] * train_records[0]["step"]
    assert 0 < first_interval < final["compile_seconds"], (first_interval, final["compile_seconds"])


@pytest.mark.slow(seconds=20)
def test_a_run_stops_at_the_first_evaluation_that_reaches_its_target(
    make_config, small_data_dir, tmp_path
):
    config = make_config(small_data_dir, **{"train.steps": 40, "train.batch_size": 16})
    config.optimizer.name = "adamw"
    config.schedule.learning_rate = 5e-2
    config.eval.every_steps = 5
    config.eval.stop_at = 1e-6  # any correct prediction: reached once unigram guessing starts
    final = loop.train_and_evaluate(config, str(tmp_path))
    evals = read_metrics(str(tmp_path))["eval"]
    accuracies = [r["masked_lm_accuracy"] for r in evals]
    assert final["target_reached"] and final["step"] == evals[-1]["step"] < 40
    assert accuracies[-1] >= 1e-6 and all(a < 1e-6 for a in accuracies[:-1])
    checkpoints = os.listdir(os.path.join(tmp_path, "checkpoints"))
    assert str(final["step"]) in checkpoints, checkpoints  # the run's end is saved
