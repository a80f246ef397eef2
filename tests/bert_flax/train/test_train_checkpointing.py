"""What a failed checkpoint read or write says about its cause, and what a resume does with a
checkpoint that does not restore: moved aside only when its files show damage."""

import errno
import glob
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from bert_flax import errors
from bert_flax.runs import checkpoint_files
from bert_flax.runs.checkpoint_files import short_reason
from bert_flax.train import resume
from bert_flax.train.step import TrainState
from tests.paths import ROOT


def test_the_cause_survives_tensorstore_s_spec_and_the_elision():
    # As a full disk failed a save in CI: the cause, then a spec of several KB (shortened here).
    spec = (
        '{\\"driver\\":\\"zarr\\",' + '\\"path\\":\\"opt_state.mu/\\",' * 200 + '\\"open\\":true}'
    )
    error = ValueError(
        'RESOURCE_EXHAUSTED: Error opening "zarr" driver: Error writing "opt_state.mu/.zarray": '
        "Failed to write 18771 bytes to file 18: No space left on device [os_error_code='28'] "
        f"[tensorstore_spec='{spec}']\nsecond line"
    )
    reason = short_reason(error)
    assert "No space left on device" in reason and "tensorstore_spec" not in reason
    assert len(reason) <= 305 and reason.startswith("RESOURCE_EXHAUSTED")


def test_a_long_message_keeps_its_head_and_tail():
    reason = short_reason(RuntimeError("head " + "x" * 1000 + " the cause"))
    assert reason.startswith("head ") and reason.endswith(" the cause") and " ... " in reason


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_worker.py")
ADAM = optax.adam(1e-3)


def kernel(step: int) -> np.ndarray:
    return np.random.default_rng(step).normal(size=(256, 8)).astype(np.float32)


def small_state(step: int, tx: optax.GradientTransformation = ADAM) -> TrainState:
    """A TrainState whose arrays say which `step` it is (random: too big to be inlined)."""
    params = {"dense": {"kernel": kernel(step)}}
    return TrainState.create(params, tx).replace(step=jnp.int32(step))


def save_steps(workdir: str, steps: tuple[int, ...]) -> None:
    checkpointer = resume.Checkpointer(workdir, every_steps=1, keep=10)
    for step in steps:
        checkpointer.save(step, small_state(step), {"data_position": step})
    checkpointer.close()


def restore(workdir: str, tx: optax.GradientTransformation = ADAM) -> tuple:
    state = small_state(0, tx)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    checkpointer = resume.Checkpointer(workdir, every_steps=1, keep=10)
    try:
        return checkpointer.restore_latest(state, jax.tree.map(lambda _: device, state))
    finally:
        checkpointer.close()


def saved(workdir: str) -> list[str]:
    return sorted(os.listdir(checkpoint_files.checkpoint_dir(workdir)))


def largest_array_file(step_dir: str, process: str = "ocdbt.process_0") -> str:
    return max(glob.glob(os.path.join(step_dir, "state", process, "d", "*")), key=os.path.getsize)


def truncate(path: str, size: int = 0) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


DAMAGES = {  # each changes step 6's files under its directory
    "array file truncated": lambda d: truncate(largest_array_file(d), 100),
    "array file deleted": lambda d: os.remove(largest_array_file(d)),
    "array metadata not JSON": lambda d: open(os.path.join(d, "state", "_METADATA"), "w").close(),
    "progress missing": lambda d: shutil.rmtree(os.path.join(d, "progress")),
    "manifest empty": lambda d: truncate(os.path.join(d, "state", "manifest.ocdbt")),
    "B-tree node truncated": lambda d: truncate(
        glob.glob(os.path.join(d, "state", "d", "*"))[0], 10
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_damage_shows_in_the_files_and_moves_the_checkpoint_aside(tmp_path, damage):
    """Step 6 damaged: `damage` names it (and nothing in step 4), the newest whole checkpoint
    (4, not 6 nor 2) restores, and step 6 is in corrupt/."""
    workdir = str(tmp_path)
    save_steps(workdir, (2, 4, 6))
    directory = checkpoint_files.checkpoint_dir(workdir)
    DAMAGES[damage](os.path.join(directory, "6"))
    assert checkpoint_files.damage(directory, 6) and checkpoint_files.damage(directory, 4) is None
    state, progress = restore(workdir)
    assert int(state.step) == 4 and progress["data_position"] == 4
    np.testing.assert_array_equal(state.params["dense"]["kernel"], kernel(4))
    assert saved(workdir) == ["2", "4", checkpoint_files.CORRUPT_DIR]
    assert os.listdir(os.path.join(directory, checkpoint_files.CORRUPT_DIR)) == ["6"]


@pytest.mark.parametrize(
    "error",
    [OSError(errno.EIO, "Input/output error"), MemoryError(), TimeoutError("read")],
    ids=["EIO", "MemoryError", "TimeoutError"],
)
def test_a_failure_that_shows_no_damage_leaves_the_checkpoint_and_stops(
    tmp_path, monkeypatch, error
):
    """A read error (I/O, memory) of a whole checkpoint: a CheckpointError naming the step, the
    cause and the remedy; nothing moved aside and no older checkpoint resumed."""
    workdir = str(tmp_path)
    save_steps(workdir, (2, 4))

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "restore", fail)
    with pytest.raises(errors.CheckpointError, match=r"step 4 .*Rerun") as info:
        restore(workdir)
    assert type(error).__name__ in str(info.value)
    assert saved(workdir) == ["2", "4"]


def test_a_whole_checkpoint_with_zeroed_arrays_is_not_shown_damaged(tmp_path):
    """Bytes that do not decode in a file of the right size are not what `damage` looks at: the
    read fails, the checkpoint stays."""
    workdir = str(tmp_path)
    save_steps(workdir, (2, 4))
    victim = largest_array_file(os.path.join(checkpoint_files.checkpoint_dir(workdir), "4"))
    with open(victim, "r+b") as f:
        f.write(b"\0" * os.path.getsize(victim))
    with pytest.raises(errors.CheckpointError, match=r"step 4 .*show no damage"):
        restore(workdir)
    assert saved(workdir) == ["2", "4"]


def test_a_checkpoint_of_another_optimizer_is_a_mismatch_and_stays(tmp_path):
    workdir = str(tmp_path)
    save_steps(workdir, (2,))
    with pytest.raises(
        errors.CheckpointMismatch, match=r"step 2 .* does not fit this run's state"
    ) as info:
        restore(workdir, optax.sgd(1e-3, momentum=0.9))
    assert "opt_state/" in str(info.value)
    assert saved(workdir) == ["2"]


@pytest.mark.slow(seconds=10)
def test_two_processes_restore_the_same_step(tmp_path, free_port):
    """Two processes (checkpoint_worker.py): a damaged newest checkpoint is moved aside once and
    both restore the same older step, also when process 1's listing lags; an I/O error in one
    process moves nothing and stops both. What they save together is whole, each process's files
    checked."""
    damaged, transient = str(tmp_path / "damaged"), str(tmp_path / "transient")
    save_steps(damaged, (2, 4, 6))
    save_steps(transient, (2, 4))
    truncate(largest_array_file(os.path.join(checkpoint_files.checkpoint_dir(damaged), "6")), 100)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("JAX_NUM_CPU_DEVICES", None)  # one CPU device per process
    workers = [
        subprocess.Popen(
            [sys.executable, WORKER, str(i), str(free_port), damaged, transient],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        finished = [worker.communicate(timeout=60) for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    for worker, (_, err) in zip(workers, finished):
        assert worker.returncode == 0, err[-4000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in finished]
    directory = checkpoint_files.checkpoint_dir(damaged)
    assert [r["damaged"] for r in results] == [{"step": 4, "kernel_ok": True}] * 2
    assert saved(damaged) == ["2", "4", "8", checkpoint_files.CORRUPT_DIR]
    assert os.listdir(os.path.join(directory, checkpoint_files.CORRUPT_DIR)) == ["6"]
    # Step 8, saved by both processes: whole, and damage in process 1's files shows.
    assert checkpoint_files.damage(directory, 8) is None
    truncate(largest_array_file(os.path.join(directory, "8"), "ocdbt.process_1"), 100)
    assert "ocdbt.process_1" in checkpoint_files.damage(directory, 8)
    errors = [r["transient"]["error"] for r in results]
    assert all("step 4" in e and "Rerun" in e for e in errors), errors
    assert "another process" in errors[0] and "Input/output error" in errors[1], errors
    assert saved(transient) == ["2", "4"]
