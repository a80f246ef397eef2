"""2N steps straight == N steps, stop (SIGTERM-style preemption), resume, N more: same state and
metrics; and SIGTERM turns into a save request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bert_flax.runs.metrics import read_metrics
from bert_flax.tasks.pretraining import task as pretraining
from bert_flax.train import loop, resume
from bert_flax.train.resume import Progress
from bert_flax.train.setup import create_train_setup
from tests.paths import ROOT

N = 3


def resume_config(make_config, data_dir, optimizer="lamb"):
    config = make_config(data_dir, **{"train.steps": 2 * N, "train.batch_size": 8})
    config.optimizer.name = optimizer
    # Shampoo: roots from the first step on, recomputed every step (synchronously: a straight
    # and a resumed run then see the same roots; asynchronous roots depend on timing).
    config.optimizer.shampoo.update(start_preconditioning_step=1, preconditioning_compute_steps=2)
    config.model.hidden_dropout_rate = 0.1  # the step RNG must resume too
    config.checkpoint.every_steps = 100  # only the preemption and the final save
    config.eval.every_steps = N
    return config


def final_params(setup, workdir):
    checkpointer = resume.Checkpointer(workdir, every_steps=1, keep=1)
    state, progress = checkpointer.restore_latest(setup.state, setup.state_shardings)
    checkpointer.close()
    return jax.device_get(state.params), progress


@pytest.mark.slow(seconds=45)
@pytest.mark.parametrize("optimizer", ["lamb", "shampoo"])
def test_resume_reproduces_straight_run(
    make_config, small_data_dir, tmp_path, monkeypatch, optimizer
):
    config = resume_config(make_config, small_data_dir, optimizer)
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    loop.train_and_evaluate(config, straight)

    with monkeypatch.context() as patch:  # a preemption notice at step N
        patch.setattr(resume.Checkpointer, "reached_preemption", lambda self, s: s == N)
        first = loop.train_and_evaluate(config, split)
    assert first["preempted"] and first["step"] == N
    assert os.path.isdir(os.path.join(split, "checkpoints", str(N)))
    second = loop.train_and_evaluate(config, split)
    assert second["steps_this_run"] == N and second["step"] == 2 * N

    setup = create_train_setup(config)  # only the target shapes and shardings
    params_a, progress_a = final_params(setup, straight)
    params_b, progress_b = final_params(setup, split)
    timed = ("train_seconds", "compile_seconds")  # wall-clock: accumulated across the resume
    assert {k: v for k, v in progress_a.items() if k not in timed} == {
        k: v for k, v in progress_b.items() if k not in timed
    }  # data position, sequences seen, seed
    assert progress_b["train_seconds"] > 0
    assert set(progress_b) == Progress.__required_keys__  # what the type says a checkpoint holds
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
    with resume.PreemptionGuard() as guard:
        assert not guard.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.requested
    assert signal.getsignal(signal.SIGTERM) is not guard._handle


def test_watchdog_ends_a_process_that_cannot_reach_a_step_boundary():
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tests.bert_flax.train.stuck_main_thread_worker"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-2000:]
    assert "did not save and stop within 1 s" in done.stderr
    assert "not reached" not in done.stdout
    assert time.perf_counter() - started < 30


def test_a_guard_that_finishes_in_time_is_not_ended():
    with resume.PreemptionGuard(grace_seconds=0.5) as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs; the "loop" saves and leaves the guard in time
        assert guard.requested
    time.sleep(1.0)  # past the grace period: the watchdog has stood down
    assert signal.getsignal(signal.SIGTERM) is not guard._handle


def test_evaluation_stops_when_preempted(make_config):
    config = make_config(**{"eval.num_batches": 6})
    setup = create_train_setup(config)
    batches = pretraining.eval_batches(config, 8, setup.task.row_shape, 512)
    assert len(batches) == 6
    full, complete = loop.evaluate(setup, setup.state.params, batches)
    assert complete and full["eval_batches"] == 6
    calls = iter(range(100))
    part, complete = loop.evaluate(
        setup, setup.state.params, batches, stop_requested=lambda: next(calls) >= 2
    )
    assert not complete and part["eval_batches"] == 2
    assert part["masked_tokens"] < full["masked_tokens"]
