"""Orbax checkpoints of the train state plus where the run stands (data position, counters).

Saved every `every_steps` steps and at the end, the last `keep` kept. A restarted run resumes from
the latest checkpoint automatically: parameters, optimizer state and step restore directly
sharded; the JSON `progress` item holds the data-iterator position (batches consumed), the
sequences seen so far and the seed (the step RNG is `fold_in(key(seed), step)`, so it resumes
too). `PreemptionGuard` turns SIGTERM into "save, then stop" at the next step boundary.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import orbax.checkpoint as ocp
from absl import logging

from bert_flax import sharding
from bert_flax.train_step import TrainState


class Checkpointer:
    """A `CheckpointManager` under `workdir/checkpoints` for a TrainState and its progress."""

    def __init__(self, workdir: str, *, every_steps: int, keep: int, enabled: bool = True):
        self.enabled = enabled
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self.manager = (
            ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=keep, save_interval_steps=every_steps, create=True
                ),
                item_names=("state", "progress"),
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


class PreemptionGuard:
    """While active, SIGTERM sets `requested` instead of killing the process at once."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.signals = signals
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        logging.warning("Received signal %d: will save a checkpoint and stop.", signum)
        self.requested = True

    def __enter__(self) -> PreemptionGuard:
        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. some notebooks): no handler
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
