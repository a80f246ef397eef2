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
import re
import shutil
import signal
import socket
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from bert_flax import sharding
from bert_flax.train_step import TrainState

ITEMS = ("state", "progress")
CORRUPT_DIR = "corrupt"  # under checkpoints/: damaged checkpoints moved aside on resume


class CheckpointError(RuntimeError):
    """No checkpoint of a run restores, or one could not be saved."""


class CheckpointMismatch(ValueError):
    """A readable checkpoint whose arrays do not fit the state (another model or optimizer)."""


def item_handlers() -> dict[str, Any]:
    """How each item is written and read (named, so that metadata reads without a target)."""
    return {"state": ocp.StandardCheckpointHandler(), "progress": ocp.JsonCheckpointHandler()}


# tensorstore appends the spec of what it was opening (a JSON of a few KB) after the cause.
TENSORSTORE_SPEC = re.compile(r"\s*\[tensorstore_spec='.*?'\]")


def short_reason(error: Exception, limit: int = 300) -> str:
    """The first line of `error` without tensorstore's spec, its middle elided past `limit`
    characters (tensorstore's messages put the cause, e.g. "No space left on device", last)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    text = TENSORSTORE_SPEC.sub("", text)
    return text if len(text) <= limit else f"{text[: limit // 3]} ... {text[-2 * limit // 3 :]}"


def readable(directory: str, step: int) -> bool:
    """Whether checkpoint `step` in `directory` restores as it describes itself (onto one
    device), read by a manager of its own that knows the items' handlers."""
    manager = ocp.CheckpointManager(directory, item_names=ITEMS, item_handlers=item_handlers())
    try:
        _read_state(manager, step)
    except Exception:  # orbax and tensorstore raise many kinds for bad files
        return False
    finally:
        manager.close()
    return True


def saved_param_misfits(directory: str, step: int, params: Any) -> list[str]:
    """The parameters of `params` (arrays or shape structs) that checkpoint `step` lacks, has
    extra or shapes otherwise, from its metadata alone; [] when they fit or the metadata does not
    read (restoring then says what is wrong)."""
    from bert_flax import parameters  # parameters reads checkpoints through this module

    manager = ocp.CheckpointManager(directory, item_names=ITEMS, item_handlers=item_handlers())
    try:
        saved = manager.item_metadata(step)["state"].tree["params"]
    except Exception:  # orbax and tensorstore raise many kinds for bad files
        return []
    finally:
        manager.close()
    expected = parameters.flat_shapes(params)
    return parameters.misfits(parameters.flat_shapes(saved), expected, f"step {step}")


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
        """The newest (state, progress) that restores, with `state`'s shapes and shardings; or
        None when there is no checkpoint. A damaged one (a missing or truncated file, unreadable
        metadata) is reported and moved aside to `checkpoints/corrupt/`, and the next older one
        is tried; a checkpoint of another model is an error (nothing moved)."""
        if not self.enabled:
            return None
        target = sharding.abstract_arrays(state, state_shardings)
        damaged = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            misfit = saved_param_misfits(self.directory, step, target.params)
            if misfit:  # said before reading: a read that fails leaves orbax's readers dangling
                raise CheckpointMismatch(
                    f"The checkpoint of step {step} in {self.directory} does not fit this run's "
                    f"model: {'; '.join(misfit)}"[:2000]
                )
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(target), progress=ocp.args.JsonRestore()
                    ),
                )
            except Exception as error:  # orbax and tensorstore raise many kinds for bad files
                if readable(self.directory, step):  # whole, but not this run's state
                    raise CheckpointMismatch(
                        f"The checkpoint of step {step} in {self.directory} does not fit this "
                        f"run's state (another model or optimizer settings?): {error}"[:2000]
                    ) from error
                damaged.append(self._set_aside(step, error))
                continue
            logging.info("Restored checkpoint of step %d from %s", step, self.directory)
            return restored.state, dict(restored.progress)
        if damaged:
            raise CheckpointError(
                f"No checkpoint in {self.directory} restores; moved aside: {', '.join(damaged)}. "
                "Start over in another workdir (or after moving checkpoints/ away)."
            )
        return None

    def _set_aside(self, step: int, error: Exception) -> str:
        """Moves step `step`'s directory to `corrupt/`; returns where it went."""
        reason = short_reason(error)
        source = os.path.join(self.directory, str(step))
        target = os.path.join(self.directory, CORRUPT_DIR, str(step))
        suffix = 1
        while os.path.exists(target):
            target, suffix = (
                os.path.join(self.directory, CORRUPT_DIR, f"{step}.{suffix}"),
                suffix + 1,
            )
        if jax.process_index() == 0 and os.path.exists(source):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(source, target)
        self.manager.reload()
        logging.warning(
            "Checkpoint of step %d does not restore (%s: %s); moved it to %s and trying the "
            "next older one.",
            step,
            type(error).__name__,
            reason,
            target,
        )
        return target

    def save(
        self, step: int, state: TrainState, progress: dict[str, Any], *, force: bool = False
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

    def _save_failed(self, error: Exception) -> CheckpointError:
        try:
            self.manager.reload()
            steps = list(self.manager.all_steps())
        except Exception:  # the directory itself may be what failed
            steps = "unknown"
        return CheckpointError(
            f"Saving a checkpoint in {self.directory} failed ({short_reason(error)}); a full "
            f"disk or a quota? The complete checkpoints are intact: steps {steps}; "
            "free space and rerun the same command to resume from the latest."
        )


def _read_state(manager: ocp.CheckpointManager, step: int) -> Any:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
        manager.item_metadata(step)["state"].tree,
    )
    restored = manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
    )
    return restored["state"]


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
