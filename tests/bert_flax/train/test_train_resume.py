"""2N steps straight == N steps, stop (SIGTERM-style preemption), resume, N more: same state and
metrics; and SIGTERM turns into a save request."""

from __future__ import annotations

import os
import signal

import jax
import numpy as np
import pytest

from bert_flax import checkpointing, train
from bert_flax.metrics import read_metrics
from bert_flax.train_setup import create_train_setup

N = 3


def resume_config(make_config, data_dir):
    config = make_config(data_dir, **{"train.steps": 2 * N, "train.batch_size": 8})
    config.model.hidden_dropout_rate = 0.1  # the step RNG must resume too
    config.checkpoint.every_steps = 100  # only the preemption and the final save
    config.eval.every_steps = N
    return config


def final_params(setup, workdir):
    checkpointer = checkpointing.Checkpointer(workdir, every_steps=1, keep=1)
    state, progress = checkpointer.restore_latest(setup.state, setup.state_shardings)
    checkpointer.close()
    return jax.device_get(state.params), progress


@pytest.mark.slow
def test_resume_reproduces_straight_run(make_config, small_data_dir, tmp_path, monkeypatch):
    config = resume_config(make_config, small_data_dir)
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    train.train_and_evaluate(config, straight)

    with monkeypatch.context() as patch:  # a preemption notice at step N
        patch.setattr(checkpointing.Checkpointer, "reached_preemption", lambda self, s: s == N)
        first = train.train_and_evaluate(config, split)
    assert first["preempted"] and first["step"] == N
    assert os.path.isdir(os.path.join(split, "checkpoints", str(N)))
    second = train.train_and_evaluate(config, split)
    assert second["steps_this_run"] == N and second["step"] == 2 * N

    setup = create_train_setup(config)  # only the target shapes and shardings
    params_a, progress_a = final_params(setup, straight)
    params_b, progress_b = final_params(setup, split)
    assert progress_a == progress_b  # data position, sequences seen, seed
    assert progress_a["data_position"] == 2 * N
    for a, b in zip(jax.tree_util.tree_leaves(params_a), jax.tree_util.tree_leaves(params_b)):
        np.testing.assert_array_equal(a, b)
    metrics_a, metrics_b = read_metrics(straight), read_metrics(split)
    for split_name in ("train", "eval"):
        for a, b in zip(metrics_a[split_name], metrics_b[split_name]):
            assert a["step"] == b["step"]
            for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "masked_lm_accuracy"):
                if key in a:
                    assert a[key] == b[key], (split_name, a["step"], key)
    assert [r["step"] for r in metrics_b["train"]] == list(range(1, 2 * N + 1))


def test_sigterm_requests_a_save():
    with checkpointing.PreemptionGuard() as guard:
        assert not guard.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.requested
    assert signal.getsignal(signal.SIGTERM) is not guard._handle
