"""Faults a long job meets, tried through the command line: divergence (the non-finite guard),
a damaged latest checkpoint (resume from the next older one), and the train step's guard itself
against a step that is applied."""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_flax import errors
from bert_flax.model import losses
from bert_flax.runs import checkpoint_files
from bert_flax.train import loop
from bert_flax.train import step as train_step
from bert_flax.train.setup import create_train_setup
from tests.paths import ROOT

# A 1-layer, 32-wide BERT on synthetic rows, by flags as a user would shrink configs/tiny.py.
SYNTHETIC = [
    "--config=configs/tiny.py",
    "--config.data.synthetic=True",
    "--config.data.max_seq_length=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.model.num_layers=1",
    "--config.model.hidden_size=32",
    "--config.model.num_heads=2",
    "--config.model.intermediate_size=64",
    "--config.model.vocab_size=512",
    "--config.train.batch_size=4",
    "--config.eval.every_steps=1000",
    "--config.eval.num_batches=1",
    "--config.eval.batch_size=4",
    "--config.schedule.warmup_steps=1",
    "--config.log.every_steps=1",
    "--config.log.plots=False",
]


def run_main(workdir, *flags: str, base: tuple[str, ...] = tuple(SYNTHETIC)):
    return subprocess.run(
        [sys.executable, "-m", "bert_flax.train", f"--workdir={workdir}", *base, *flags],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )


def start_main(
    workdir, *flags: str, python: tuple[str, ...] = ("-m", "bert_flax.train"), **popen
) -> subprocess.Popen:
    """The SYNTHETIC job in the background (stdout discarded); `python` runs the program."""
    return subprocess.Popen(
        [sys.executable, *python, f"--workdir={workdir}", *SYNTHETIC, *flags],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        stdout=subprocess.DEVNULL,
        **popen,
    )


def saved_steps(workdir) -> list[int]:
    names = os.listdir(os.path.join(workdir, "checkpoints"))
    return sorted(int(n) for n in names if n.isdigit())


@pytest.mark.slow(seconds=25)
def test_a_non_finite_step_is_not_applied(make_config):
    """A batch whose loss is NaN leaves parameters and optimizer state as they were (the step
    counter moves on, the streak counts it): a finite step after it gives exactly the state that
    step gives from the start, and resets the streak."""
    config = make_config(**{"schedule.warmup_steps": 0})  # the first update is not 0
    setup, reference = create_train_setup(config), create_train_setup(config)
    batch = setup.make_batch(seed=0)
    poisoned = dict(batch, masked_lm_weights=batch["masked_lm_weights"] * jnp.nan)
    before = jax.device_get(setup.state)
    state, metrics = setup.train_step(setup.state, poisoned, jax.random.key(0))
    after = jax.device_get(state)
    assert int(after.step) == 1 and int(after.nonfinite_streak) == 1
    assert float(metrics["nonfinite_steps"]) == 1.0 and float(metrics["nonfinite_streak"]) == 1.0
    for old, new in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        if old.shape:  # every array but the two counters
            np.testing.assert_array_equal(old, new)
    state, metrics = setup.train_step(state, batch, jax.random.key(1))
    assert int(state.nonfinite_streak) == 0 and float(metrics["nonfinite_steps"]) == 0.0
    expected, _ = reference.train_step(reference.state, batch, jax.random.key(1))
    params, expected = jax.device_get((state.params, expected.params))
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(got, want)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(before.params))
    )


@pytest.mark.parametrize("scale", [jnp.nan, 1e39], ids=["nan_update", "overflow"])
def test_a_finite_gradient_with_a_non_finite_update_is_not_applied(make_config, scale):
    """The optimizer turns a finite loss and gradient into NaN (as a bad trust ratio or matrix
    root can) or overflows the parameters (a huge learning rate): the step is skipped like a
    non-finite gradient, parameters and optimizer state unchanged."""
    setup = create_train_setup(make_config(**{"schedule.warmup_steps": 0}))
    tx = optax.chain(setup.tx, optax.scale(scale))
    step = jax.jit(
        functools.partial(
            train_step.train_step, model=setup.model, tx=tx, learning_rate=setup.learning_rate,
            objective=losses.pretraining_objective(),
        )
    )  # fmt: skip
    state = train_step.TrainState.create(jax.device_get(setup.state.params), tx)
    before = jax.device_get(state)
    after, metrics = jax.device_get(step(state, setup.make_batch(seed=0), jax.random.key(0)))
    assert np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])
    assert float(metrics["nonfinite_steps"]) == 1.0 and int(after.nonfinite_streak) == 1
    assert int(after.step) == 1
    for old, new in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        if old.shape:  # every array but the counters
            np.testing.assert_array_equal(old, new)


@pytest.mark.slow(seconds=60)
def test_divergence_stops_without_saving_over_finite_checkpoints(tmp_path):
    """The issue's run: 20 fine steps with checkpoints, then a learning rate of 1e12 from the
    same workdir: it stops with status 3 and a message naming the last finite checkpoint, which
    is still there, and every saved checkpoint restores to finite parameters."""
    workdir = tmp_path / "run"
    done = run_main(workdir, "--config.train.steps=20", "--config.checkpoint.every_steps=10")
    assert done.returncode == 0, done.stderr[-2000:]
    diverging = run_main(
        workdir,
        "--config.train.steps=60",
        "--config.checkpoint.every_steps=10",
        "--config.checkpoint.keep=2",
        "--config.schedule.learning_rate=1e12",
    )
    assert diverging.returncode == errors.DIVERGED_EXIT_STATUS, diverging.stderr[-3000:]
    last_line = [line for line in diverging.stderr.splitlines() if "Training diverged" in line]
    assert last_line and "consecutive steps up to step" in last_line[0]
    latest = max(saved_steps(workdir))
    assert f"last checkpoint (all are finite) is step {latest}" in last_line[0]
    assert "Traceback" not in diverging.stderr
    for step in saved_steps(workdir):
        _, params = checkpoint_files.restore_params(str(workdir), step)
        assert all(np.isfinite(p).all() for p in jax.tree.leaves(params)), step


def damage_checkpoint(step_dir, how: str) -> None:
    """Truncates to half, or deletes, the largest array file of the checkpoint in `step_dir`."""
    files = [
        f
        for f in glob.glob(str(step_dir / "state" / "**" / "*"), recursive=True)
        if os.path.isfile(f) and os.path.getsize(f) > 64 and "metadata" not in f
    ]
    victim = max(files, key=os.path.getsize)
    if how == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
    else:
        os.remove(victim)


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_damaged_latest_checkpoint_is_set_aside(tmp_path, damage):
    """Checkpoints at 10 and 20; one data file of step 20 truncated or deleted: the rerun warns,
    moves step 20 to checkpoints/corrupt/ and resumes from step 10 to finish at 30. With step 30
    damaged in turn, reading the run's parameters (init_from) gives step 20's, leaving 30."""
    workdir = tmp_path / "run"
    flags = ["--config.checkpoint.every_steps=10"]
    assert run_main(workdir, "--config.train.steps=20", *flags).returncode == 0
    damage_checkpoint(workdir / "checkpoints" / "20", damage)
    rerun = run_main(workdir, "--config.train.steps=30", *flags)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Checkpoint of step 20 does not restore" in rerun.stderr
    assert "Restored checkpoint of step 10" in rerun.stderr
    assert os.path.isdir(workdir / "checkpoints" / checkpoint_files.CORRUPT_DIR / "20")
    assert saved_steps(workdir) == [10, 20, 30]
    # Step 30 damaged in turn, where reading only the parameters meets it too (a truncated data
    # file may hold only optimizer state): its OCDBT manifest truncated.
    with open(workdir / "checkpoints" / "30" / "state" / "manifest.ocdbt", "r+b") as f:
        f.truncate(10)
    step, _ = checkpoint_files.restore_params(str(workdir))
    assert step == 20 and saved_steps(workdir) == [10, 20, 30]


@pytest.mark.slow(seconds=20)
def test_no_restorable_checkpoint_is_a_clear_error(make_config, tmp_path):
    config = make_config(**{"train.steps": 2, "checkpoint.every_steps": 1})
    workdir = str(tmp_path / "run")
    loop.train_and_evaluate(config, workdir)
    for path in glob.glob(os.path.join(workdir, "checkpoints", "*", "state", "_METADATA")):
        with open(path, "w") as f:
            f.write("not json")
    with pytest.raises(errors.CheckpointError, match=r"No checkpoint in .* restores"):
        loop.train_and_evaluate(config, workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints", "corrupt"))) == ["1", "2"]


def test_a_checkpoint_of_another_model_is_an_error_and_stays(make_config, tmp_path):
    workdir = str(tmp_path / "run")
    loop.train_and_evaluate(make_config(**{"train.steps": 2}), workdir)
    wider = make_config(**{"train.steps": 4})
    wider.model.intermediate_size = 96
    with pytest.raises(errors.CheckpointMismatch, match=r"step 2 .* does not fit") as info:
        loop.train_and_evaluate(wider, workdir)
    # Named from the metadata, with both shapes, before any array is read.
    assert re.search(
        r"layer_0/\S*intermediate\S*: step 2 has shape \(\d+, 64\), the model \(\d+, 96\)",
        str(info.value),
    ), str(info.value)
    assert saved_steps(workdir) == [2]
    assert not os.path.exists(os.path.join(workdir, "checkpoints", checkpoint_files.CORRUPT_DIR))


@pytest.fixture
def small_disk(tmp_path):
    """A 900 KB tmpfs: room for one checkpoint of the SYNTHETIC model, not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=900k", "tmpfs", str(mount)])
    if done.returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", str(mount)])


@pytest.mark.slow(seconds=25)
def test_a_full_disk_is_a_clear_error_and_keeps_the_saved_checkpoints(small_disk):
    workdir = small_disk / "run"
    flags = ["--config.train.steps=15", "--config.checkpoint.every_steps=5"]
    done = run_main(workdir, *flags)
    assert done.returncode == errors.USER_ERROR_EXIT_STATUS, done.stderr[-3000:]
    # Whichever write meets the full disk first (a checkpoint, or metrics.jsonl) names it; orbax's
    # background threads may still print after that line.
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr[-3000:]
    _, params = checkpoint_files.restore_params(str(workdir), 5)
    assert all(np.isfinite(p).all() for p in jax.tree.leaves(params))


@pytest.mark.slow(seconds=45)
def test_kill_9_while_saving_resumes_from_the_last_complete_checkpoint(tmp_path):
    """SIGKILL while step 20's checkpoint is written but not yet committed (orbax renames its
    temporary directory when complete): the rerun resumes from step 10 and saves 20 and 30."""
    workdir = tmp_path / "run"
    flags = ["--config.train.steps=400", "--config.checkpoint.every_steps=10"]
    log = tmp_path / "job.log"
    with open(log, "w") as stderr:
        held = ("-m", "tests.bert_flax.train.hold_commit_worker")
        job = start_main(workdir, *flags, python=held, stderr=stderr)
        deadline = time.monotonic() + 300
        try:
            while not (workdir / "commit_held").exists() and job.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            job.kill()
            job.wait()
    assert (workdir / "commit_held").exists(), log.read_text()[-3000:]
    names = os.listdir(workdir / "checkpoints")
    assert "20" not in names and any(n.startswith("20.orbax-checkpoint-tmp") for n in names), names
    rerun = run_main(workdir, "--config.train.steps=30", "--config.checkpoint.every_steps=10")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed = [line for line in rerun.stderr.splitlines() if "Restored checkpoint of step" in line]
    assert len(resumed) == 1 and "Restored checkpoint of step 10 " in resumed[0], resumed
    assert saved_steps(workdir) == [10, 20, 30]


@pytest.mark.slow(seconds=55)
def test_a_data_file_truncated_between_runs_is_named(small_data_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(small_data_dir, data)
    workdir = tmp_path / "run"
    flags = [
        f"--config.data.data_dir={data}",
        "--config.data.synthetic=False",
        "--config.data.max_seq_length=64",
        "--config.train.steps=4",
        "--config.checkpoint.every_steps=2",
    ]
    real = tuple(f for f in SYNTHETIC if "vocab_size" not in f)  # the data's vocabulary
    assert run_main(workdir, *flags, base=real).returncode == 0
    shard = sorted(data.glob("train-*.tfrecord"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 10)
    rerun = run_main(workdir, *flags[:-2], "--config.train.steps=8", base=real)
    assert rerun.returncode == errors.USER_ERROR_EXIT_STATUS, rerun.stderr[-3000:]
    last = rerun.stderr.strip().splitlines()[-1]
    assert shard.name in last and "recreate the data" in last, last


def start_and_signal_on(workdir, marker: str, *flags: str) -> tuple[int, str, float]:
    """Runs the SYNTHETIC job, sends SIGTERM when a stderr line contains `marker`; returns the
    exit status, the whole stderr and the seconds from the signal to the exit."""
    job = start_main(workdir, *flags, stderr=subprocess.PIPE, text=True)
    lines, signalled = [], None
    for line in job.stderr:
        lines.append(line)
        if signalled is None and marker in line:
            job.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
    status = job.wait(timeout=120)
    assert signalled is not None, "".join(lines)[-3000:]
    return status, "".join(lines), time.monotonic() - signalled


@pytest.mark.slow(seconds=30)
def test_sigterm_during_the_first_compilation_then_rerun(tmp_path):
    """SIGTERM right after the setup is logged (the first step compiles next): the run saves at
    its first step boundary or the watchdog ends it within the grace period keeping nothing
    partial; the rerun finishes and every checkpoint restores."""
    workdir = tmp_path / "run"
    flags = ["--config.train.steps=20", "--config.checkpoint.every_steps=10"]
    status, stderr, seconds = start_and_signal_on(workdir, "Setup:", *flags)
    assert status in (0, 128 + signal.SIGTERM), stderr[-3000:]
    assert seconds < 30
    rerun = run_main(workdir, *flags)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for step in saved_steps(workdir):
        checkpoint_files.restore_params(str(workdir), step)
    assert 20 in saved_steps(workdir)


@pytest.mark.slow(seconds=30)
def test_sigterm_during_evaluation_saves_and_stops(tmp_path):
    """SIGTERM as the step-4 evaluation starts (200 batches): it stops between batches, saves
    step 4 and exits 0; the rerun resumes from step 4."""
    workdir = tmp_path / "run"
    flags = [
        "--config.train.steps=8",
        "--config.eval.every_steps=4",
        "--config.eval.num_batches=200",
        "--config.checkpoint.every_steps=100",
    ]
    status, stderr, seconds = start_and_signal_on(workdir, "step 4/8", *flags)
    assert status == 0 and seconds < 30, stderr[-3000:]
    assert "Stopping at step 4 after saving (preemption)" in stderr
    assert saved_steps(workdir) == [4]
    rerun = run_main(workdir, *flags)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Restored checkpoint of step 4" in rerun.stderr
