"""Orbax checkpoints of the train state plus where the run stands (data position, counters).

Saved every `every_steps` steps and at the end, the last `keep` kept. A restarted run resumes from
the latest checkpoint automatically: parameters, optimizer state and step restore directly
sharded; the JSON `progress` item holds the data-iterator position (batches consumed), the
sequences seen so far and the seed (the step RNG is `fold_in(key(seed), step)`, so it resumes
too). `PreemptionGuard` turns SIGTERM into "save, then stop" at the next step boundary, and
ends the process after a grace period if the loop cannot get there (a long compilation).

A checkpoint that does not restore is moved aside to `checkpoints/corrupt/` only when its files
show damage (`damage`: checked without reading the arrays); any other failure (an I/O error, out
of memory) leaves it in place and stops the run, so a rerun retries it. With several processes,
all restore the same step and act on what the worst-off of them met.
"""

import enum
import os
import shutil
import signal
import socket
import threading
from typing import Any, NotRequired, TypedDict

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

import optim.soap_core
from bert_flax import errors, sharding
from bert_flax.runs import checkpoint_files
from bert_flax.train.step import TrainState


class Phase(TypedDict):
    """A phase of two-phase pre-training: the step it started at and the data it reads."""

    step: int
    data: str


class Progress(TypedDict):
    """Where the run stands, saved beside the state in each checkpoint (its JSON item). (No
    `from __future__ import annotations` in this module: it would hide `NotRequired` here.)"""

    data_position: int  # batches of this phase's data consumed
    sequences_seen: float
    train_seconds: float  # wall-clock seconds in training steps (evaluations excluded)
    compile_seconds: float  # compiling the train step, once per process (not training)
    seed: int
    data: str  # the data's identity (`Task.identity`)
    phases: NotRequired[list[Phase]]  # after the first phase: where each later one started


class Outcome(enum.IntEnum):
    """What a process met reading a checkpoint, from the best to the worst."""

    RESTORED = 0
    DAMAGED = 1  # its files show damage: moved aside, the next older one tried
    MISMATCH = 2  # whole, but another model's or optimizer's state
    FAILED = 3  # anything else (I/O, memory): left in place, the run stops


def _from_process_0(value: int) -> int:
    """Process 0's `value`, on every process."""
    if jax.process_count() == 1:
        return value
    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _worst(outcome: Outcome) -> Outcome:
    """The worst `outcome` any process met, on every process (a barrier)."""
    if jax.process_count() == 1:
        return outcome
    return Outcome(int(np.max(multihost_utils.process_allgather(np.int32(outcome)))))


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


class Checkpointer:
    """A `CheckpointManager` under `workdir/checkpoints` for a TrainState and its progress."""

    def __init__(self, workdir: str, *, every_steps: int, keep: int, enabled: bool = True):
        self.enabled = enabled
        self.directory = checkpoint_files.checkpoint_dir(workdir)
        # create=False: the first save makes the directory, so a run that stops on bad input
        # before it leaves the workdir as it was.
        self.manager = (
            ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=keep, save_interval_steps=every_steps, create=False
                ),
                item_names=checkpoint_files.ITEMS,
            )
            if enabled
            else None
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step() if self.enabled else None

    def restore_latest(
        self, state: TrainState, state_shardings: TrainState
    ) -> tuple[TrainState, Progress] | None:
        """The newest (state, progress) that restores, with `state`'s shapes and shardings; or
        None when there is no checkpoint. One whose files show damage
        (`checkpoint_files.damage`) is reported and moved aside to `checkpoints/corrupt/`, and the
        next older one is tried; a checkpoint of another model is a CheckpointMismatch and any
        other failure (an I/O error, out of memory) a CheckpointError, both leaving it in place.
        Every process tries process 0's newest step and acts on the worst outcome any of them
        met."""
        if not self.enabled:
            return None
        target = sharding.abstract_arrays(state, state_shardings)
        damaged, tried = [], set()
        while (step := self._next_step(tried)) is not None:
            tried.add(step)
            misfit = checkpoint_files.saved_misfits(self.directory, step, target.params, "params")
            if misfit:  # said before reading: a read that fails leaves orbax's readers dangling
                raise errors.CheckpointMismatch(
                    f"The checkpoint of step {step} in {self.directory} does not fit this run's "
                    f"model: {'; '.join(misfit)}"[:2000]
                )
            restored, outcome, reason = self._read(step, target)
            agreed = _worst(outcome)
            if agreed == Outcome.RESTORED:
                logging.info("Restored checkpoint of step %d from %s", step, self.directory)
                return restored
            reason = reason if agreed == outcome else "met by another process: see its log"
            if agreed != Outcome.DAMAGED:
                raise self._not_restored(step, agreed, reason)
            damaged.append(self._set_aside(step, reason))
        if damaged:
            raise errors.CheckpointError(
                f"No checkpoint in {self.directory} restores; moved aside: {', '.join(damaged)}. "
                "Start over in another workdir (or after moving checkpoints/ away)."
            )
        return None

    def _next_step(self, tried: set[int]) -> int | None:
        """Process 0's newest step not in `tried`, on every process; None when none is left."""
        step = _from_process_0(max(set(self.manager.all_steps()) - tried, default=-1))
        return None if step < 0 else step

    def _read(self, step: int, target: TrainState) -> tuple[Any, Outcome, str]:
        """((state, progress) or None, the outcome, why it did not restore), read by the items'
        handlers: without the manager's barrier, so that a process whose read fails still meets
        the others where they agree."""
        path, handlers = epath.Path(self.directory) / str(step), checkpoint_files.item_handlers()
        try:
            state = self._read_state(handlers["state"], path / "state", step, target)
            progress = handlers["progress"].restore(path / "progress", args=ocp.args.JsonRestore())
            return (state, dict(progress)), Outcome.RESTORED, ""
        except Exception as error:  # orbax and tensorstore raise many kinds for bad files
            shown = checkpoint_files.damage(self.directory, step)
            if shown:
                return None, Outcome.DAMAGED, shown
            misfit = checkpoint_files.saved_misfits(self.directory, step, target)
            if misfit:
                return None, Outcome.MISMATCH, "; ".join(misfit)
            return (
                None,
                Outcome.FAILED,
                f"{type(error).__name__}: {checkpoint_files.short_reason(error)}",
            )
        finally:
            for handler in handlers.values():
                handler.close()

    def _read_state(self, handler: Any, path: epath.Path, step: int, target: TrainState) -> Any:
        """The state of checkpoint `step` as `target` lays it out; a SOAP state saved before
        SOAP had a state of its own (commit 8ea607a and older) is read in that layout."""
        legacy = optim.soap_core.legacy_layout(target)
        if (
            legacy is not None
            and checkpoint_files.saved_misfits(self.directory, step, target)
            and not checkpoint_files.saved_misfits(self.directory, step, legacy)
        ):
            restored = handler.restore(path, args=ocp.args.StandardRestore(legacy))
            return optim.soap_core.from_legacy_layout(restored, target)
        return handler.restore(path, args=ocp.args.StandardRestore(target))

    def _not_restored(self, step: int, outcome: Outcome, reason: str) -> Exception:
        """The error for checkpoint `step` that is left in place: another model's or optimizer's
        state, or a failure that shows no damage (logged as such)."""
        if outcome == Outcome.MISMATCH:
            return errors.CheckpointMismatch(
                f"The checkpoint of step {step} in {self.directory} does not fit this run's "
                f"state (another model or optimizer settings?): {reason}"[:2000]
            )
        logging.error(
            "Checkpoint of step %d does not restore (%s) but its files show no damage: left in "
            "place, no older one resumed; rerun to retry.",
            step,
            reason,
        )
        return checkpoint_files.read_failed(self.directory, step, reason)

    def _set_aside(self, step: int, reason: str) -> str:
        """Moves step `step`'s directory to `corrupt/` (process 0); returns where it went."""
        source = os.path.join(self.directory, str(step))
        target = os.path.join(self.directory, checkpoint_files.CORRUPT_DIR, str(step))
        suffix = 1
        while os.path.exists(target):
            target, suffix = (
                os.path.join(self.directory, checkpoint_files.CORRUPT_DIR, f"{step}.{suffix}"),
                suffix + 1,
            )
        _sync(f"bert_flax: setting aside checkpoint {step}")  # every process named `target`
        if jax.process_index() == 0 and os.path.exists(source):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(source, target)
        _sync(f"bert_flax: set aside checkpoint {step}")
        self.manager.reload()
        logging.warning(
            "Checkpoint of step %d does not restore, its files show damage (%s); moved it to %s "
            "and trying the next older one.",
            step,
            reason,
            target,
        )
        return target

    def save(
        self, step: int, state: TrainState, progress: Progress, *, force: bool = False
    ) -> bool:
        """Saves if `step` is on the interval (or `force`); returns whether it saved."""
        if not self.enabled:
            return False
        try:  # a failed background write of an earlier save surfaces here too
            saved = self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave(progress)
                ),
                force=force,
            )
        except Exception as error:  # orbax and tensorstore raise many kinds for failed writes
            raise self._save_failed(error) from error
        if saved:
            logging.info("Saving checkpoint of step %d", step)
        return saved

    def reached_preemption(self, step: int) -> bool:
        """Whether JAX's preemption notice (TPU/multi-host) asks to save at `step`."""
        return self.enabled and self.manager.reached_preemption(step)

    def close(self) -> None:
        """Waits for the last save; a failed one is a CheckpointError (after closing)."""
        if not self.enabled:
            return
        failure = None
        # A failed background write may surface in either call (it is raised once, by whichever
        # reaches it first): both are guarded.
        for finish in (self.manager.wait_until_finished, self.manager.close):
            try:
                finish()
            except Exception as error:  # orbax and tensorstore raise many kinds for failed writes
                failure = failure or self._save_failed(error)
        if failure is not None:
            raise failure

    def _save_failed(self, error: Exception) -> errors.CheckpointError:
        try:
            self.manager.reload()
            steps = list(self.manager.all_steps())
        except Exception:  # the directory itself may be what failed
            steps = "unknown"
        return errors.CheckpointError(
            f"Saving a checkpoint in {self.directory} failed "
            f"({checkpoint_files.short_reason(error)}); a full disk or a quota? The complete "
            f"checkpoints are intact: steps {steps}; free "
            "space and rerun the same command to resume from the latest."
        )


class PreemptionGuard:
    """While active, SIGTERM sets `requested` instead of killing the process at once.

    The training loop looks at `requested` at every step and evaluation batch and then saves
    and stops. When the main thread cannot get there in time (a long compilation, a long step,
    a checkpoint write that outlasts the grace period), a watchdog thread ends the process
    `grace_seconds` after the signal, with status 128 + signal: orbax commits a checkpoint only
    once it is complete, so the last complete one is what a restart resumes from. On a
    preemptible TPU the grace period before SIGKILL is about 30 s.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,), *, grace_seconds: float = 0.0):
        self.signals = signals
        self.grace_seconds = grace_seconds
        self.requested = False
        self._previous: dict[int, Any] = {}
        self._done = threading.Event()
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_wakeup_fd = -1

    def _handle(self, signum, frame) -> None:
        if not self.requested:
            logging.warning("Received signal %d: will save a checkpoint and stop.", signum)
        self.requested = True

    def _watch(self) -> None:
        """Wakes on the signal's byte (written by Python's C-level handler even while the
        main thread is inside XLA) and ends the process if the loop has not finished."""
        receiver = self._wakeup[0]
        while not self._done.is_set():
            try:
                data = receiver.recv(1)
            except OSError:
                return
            if not data or self._done.is_set():
                return
            if data[0] not in self.signals:
                continue
            if self._done.wait(self.grace_seconds):
                return
            logging.error(
                "Signal %d: the loop did not save and stop within %.0f s; exiting now. The "
                "last complete checkpoint is kept.",
                data[0],
                self.grace_seconds,
            )
            logging.flush()
            os._exit(128 + data[0])

    def __enter__(self) -> "PreemptionGuard":
        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. some notebooks): no handler
                pass
        if self._previous and self.grace_seconds > 0:
            self._wakeup = socket.socketpair()
            for end in self._wakeup:
                end.setblocking(True)
            self._wakeup[1].setblocking(False)
            self._previous_wakeup_fd = signal.set_wakeup_fd(
                self._wakeup[1].fileno(), warn_on_full_buffer=False
            )
            threading.Thread(target=self._watch, name="preemption-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            self._wakeup[1].send(b"\0")  # wakes the watchdog, which sees `_done` and returns
            for end in self._wakeup:
                end.close()
            self._wakeup = None
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}
