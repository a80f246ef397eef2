"""Orbax checkpoints of the train state plus where the run stands (data position, counters).

Saved every `every_steps` steps and at the end, the last `keep` kept. A restarted run resumes from
the latest checkpoint automatically: parameters, optimizer state and step restore directly
sharded; the JSON `progress` item holds the data-iterator position (batches consumed), the
sequences seen so far and the seed (the step RNG is `fold_in(key(seed), step)`, so it resumes
too). `PreemptionGuard` turns SIGTERM into "save, then stop" at the next step boundary, and
ends the process after a grace period if the loop cannot get there (a long compilation).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from bert_flax import sharding
from bert_flax.train_step import TrainState

ITEMS = ("state", "progress")


def checkpoint_dir(workdir: str) -> str:
    return os.path.abspath(os.path.join(workdir, "checkpoints"))


class Checkpointer:
    """A `CheckpointManager` under `workdir/checkpoints` for a TrainState and its progress."""

    def __init__(self, workdir: str, *, every_steps: int, keep: int, enabled: bool = True):
        self.enabled = enabled
        self.directory = checkpoint_dir(workdir)
        self.manager = (
            ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=keep, save_interval_steps=every_steps, create=True
                ),
                item_names=ITEMS,
            )
            if enabled
            else None
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step() if self.enabled else None

    def restore_latest(
        self, state: TrainState, state_shardings: TrainState
    ) -> tuple[TrainState, dict[str, Any]] | None:
        """The latest (state, progress), restored with `state`'s shapes and shardings; or None."""
        step = self.latest_step()
        if step is None:
            return None
        target = sharding.abstract_arrays(state, state_shardings)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), progress=ocp.args.JsonRestore()
            ),
        )
        logging.info("Restored checkpoint of step %d from %s", step, self.directory)
        return restored.state, dict(restored.progress)

    def save(
        self, step: int, state: TrainState, progress: dict[str, Any], *, force: bool = False
    ) -> bool:
        """Saves if `step` is on the interval (or `force`); returns whether it saved."""
        if not self.enabled:
            return False
        saved = self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave(progress)
            ),
            force=force,
        )
        if saved:
            logging.info("Saving checkpoint of step %d", step)
        return saved

    def reached_preemption(self, step: int) -> bool:
        """Whether JAX's preemption notice (TPU/multi-host) asks to save at `step`."""
        return self.enabled and self.manager.reached_preemption(step)

    def close(self) -> None:
        if self.enabled:
            self.manager.wait_until_finished()
            self.manager.close()


def restore_params(workdir: str, step: int | None = None) -> tuple[int, Any]:
    """(step, parameters as numpy) of a run's checkpoint: the latest, or `step`. The whole
    state is read onto one device (whatever mesh wrote it) and only the parameters kept."""
    directory = checkpoint_dir(workdir)
    handlers = {"state": ocp.StandardCheckpointHandler(), "progress": ocp.JsonCheckpointHandler()}
    manager = ocp.CheckpointManager(directory, item_names=ITEMS, item_handlers=handlers)
    try:
        steps = list(manager.all_steps())
        if not steps:
            raise FileNotFoundError(f"{directory} holds no checkpoint (is {workdir} a run?).")
        step = max(steps) if step is None else step
        if step not in steps:
            raise ValueError(f"{directory} has no checkpoint of step {step}; it has {steps}.")
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree_util.tree_map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
            manager.item_metadata(step)["state"].tree,
        )
        restored = manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
        )
    finally:
        manager.close()
    return step, jax.tree_util.tree_map(np.asarray, restored["state"]["params"])


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

    def __enter__(self) -> PreemptionGuard:
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
