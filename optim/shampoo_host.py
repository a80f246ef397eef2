"""Shampoo's asynchronous inverse roots: host threads compute them off the training step.

With ``asynchronous=True`` the jitted update never computes roots. The train loop calls
``opt_state = optim.after_step(tx, opt_state, step)`` after every update, and the host:

1. when a job is in flight, swaps its roots into the state if it has finished (and
   ``swap_when_done``), or waits for it once it has been in flight ``max_staleness`` steps;
2. when the statistics after this update are due (the synchronous schedule: updates S, S + N,
   ...), copies them to host memory and submits them to a worker thread, which computes the roots
   with the same function as the graph (:func:`optim.shampoo_core.compute_roots`), jitted on the
   CPU device, in float32 or float64 (``host_root_dtype``). With ``max_staleness=0`` it waits at
   once, so the roots in use equal the synchronous mode's at every step.

Swapped-in roots are placed with ``jax.device_put`` like the roots they replace (sharding and
committedness), so the jitted step does not recompile. Only one job is in flight.
The first call also has the worker compile the host solver (on zeros of the statistics' shapes)
while the first steps run, so the first root job does not pay for compilation.

Between jobs ``after_step`` touches no device array: it mirrors the update count from ``step``
(which grows by one per loop step). A step the loop skipped (not finite) leaves the count behind the
mirror, so wherever the mirror says work is due the host first reads the count from the state:
refreshes stay on the cadence in optimizer updates, whatever was skipped. On its first call, and
whenever ``step`` does not follow the previous one (a restored checkpoint), it drops any in-flight
job, reads the count from the state and, if roots were due but missing (a job dropped by the
checkpoint), submits one at once: an in-flight job is not part of a checkpoint; it is recomputed
from the restored statistics.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from optim.shampoo_core import (
    ShampooConfig,
    ShampooState,
    adopt_bases,
    compute_roots,
    factor_lists,
    with_factor_roots,
)

# One jitted solver for all hosts: compiled once per solver settings and statistics shapes.
_compute_roots = jax.jit(compute_roots, static_argnames=("exponents", "solver"))
_adopt_bases = jax.jit(adopt_bases, static_argnames=("config",))


class _JobResult(NamedTuple):
    roots: list[np.ndarray]
    failures: int
    error: float
    seconds: float


class _Job(NamedTuple):
    future: concurrent.futures.Future
    submitted_at: int  # the update count whose statistics it uses


def _is_shampoo_state(x: Any) -> bool:
    return isinstance(x, ShampooState)


def find_shampoo_state(opt_state: Any) -> ShampooState:
    """The one :class:`ShampooState` inside ``opt_state`` (which may be any wrapper's state)."""
    leaves = jax.tree.leaves(opt_state, is_leaf=_is_shampoo_state)
    found = [x for x in leaves if _is_shampoo_state(x)]
    if len(found) != 1:
        raise ValueError(
            f"Expected exactly one ShampooState in the optimizer state, found {len(found)}; pass "
            "the opt_state of the Shampoo transformation (or of a wrapper around it)."
        )
    return found[0]


def _replace_shampoo_state(opt_state: Any, new: ShampooState) -> Any:
    return jax.tree.map(
        lambda x: new if _is_shampoo_state(x) else x, opt_state, is_leaf=_is_shampoo_state
    )


def _put_like(value: np.ndarray, like: Any) -> Any:
    """``value`` placed like ``like``: same dtype, sharding and committedness.

    Committedness matters too: jit's outputs from uncommitted inputs are uncommitted, and a
    committed replacement would make the next step recompile.
    """
    value = np.asarray(value, dtype=like.dtype)
    if not isinstance(like, jax.Array):
        return value
    return jax.device_put(value, like.sharding) if like.committed else jax.device_put(value)


def _placed_like(value: jax.Array, like: Any) -> Any:
    """A device array computed from ``like`` placed as ``like`` is (see ``_put_like``)."""
    if isinstance(like, jax.Array) and like.committed:
        return jax.device_put(value, like.sharding)
    return value


class ShampooHost:
    """The host side of one Shampoo transformation (see the module doc)."""

    def __init__(self, config: ShampooConfig):
        self.config = config
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._job: _Job | None = None
        self._last_step: int | None = None
        self._count_offset = 0
        self._failures = 0
        self._catch_up = False
        self._warmed_up = False
        self._jobs = 0
        self._last_seconds = 0.0
        self._total_seconds = 0.0
        self._wait_seconds = 0.0

    # -- the train loop's hooks -------------------------------------------------------------
    def after_step(self, opt_state: Any, step: int) -> Any:
        if not self.config.asynchronous:
            return opt_state
        resync = self._last_step is None or step != self._last_step + 1
        state = find_shampoo_state(opt_state) if resync else None
        if resync:
            self._resync(state, step)
        self._last_step = step
        if not any(self._due(step + self._count_offset)):
            return opt_state  # the common case: no device array touched, no tree rebuilt
        if state is None:
            state = find_shampoo_state(opt_state)
        # A step the loop skipped (not finite) did not advance the count: the mirror runs ahead
        # of it, so it is due here first; read the true count before acting on it.
        count = int(jax.device_get(state.count))
        self._count_offset = count - step
        swap, submit = self._due(count)
        if not (swap or submit):
            return opt_state
        if swap:
            state = self._swap(state)
        if submit:
            self._catch_up = False
            self._submit(state, count)
            if self._job is not None and self.config.staleness_bound == 0:
                state = self._swap(state)
        return _replace_shampoo_state(opt_state, state)

    def _due(self, count: int) -> tuple[bool, bool]:
        """(swap the job in flight, submit a new one) after update `count`."""
        submit = self._catch_up or bool(self.config.refresh_due(count))
        swap = self._job is not None and (
            (self.config.swap_when_done and self._job.future.done())
            or count - self._job.submitted_at >= self.config.staleness_bound
            or submit  # a new job is due: the one in flight goes in first
        )
        return swap, submit

    def metrics(self, opt_state: Any) -> dict[str, float]:
        state = find_shampoo_state(opt_state)
        count, roots_step, failures, error = jax.device_get(
            (state.count, state.roots_step, state.root_failures, state.root_error)
        )
        metrics = {
            "shampoo/root_failures": float(failures),
            "shampoo/root_error": float(error),
            "shampoo/roots_age": float(count - roots_step),
        }
        if self.config.asynchronous:
            in_flight = 0 if self._job is None else int(count) - self._job.submitted_at
            metrics |= {
                "shampoo/staleness": float(in_flight),
                "shampoo/root_jobs": float(self._jobs),
                "shampoo/root_seconds": self._last_seconds,
                "shampoo/root_seconds_total": self._total_seconds,
                "shampoo/root_wait_seconds_total": self._wait_seconds,
            }
        return metrics

    def reset(self) -> None:
        """Forget the in-flight job and resynchronise with the state at the next call."""
        if self._job is not None:
            self._job.future.cancel()
        self._job = None
        self._last_step = None

    # -- internals -----------------------------------------------------------------------------
    def _resync(self, state: ShampooState, step: int) -> None:
        """Drop any job and read the count (and roots bookkeeping) from the state."""
        self.reset()
        count, roots_step, failures = (
            int(x) for x in jax.device_get((state.count, state.roots_step, state.root_failures))
        )
        self._count_offset, self._failures = count - step, failures
        self._catch_up = self._last_due(count) > roots_step
        if not self._warmed_up:
            self._warm_up(state)

    def _last_due(self, count: int) -> int:
        start, every = (
            self.config.start_preconditioning_step,
            self.config.preconditioning_compute_steps,
        )
        return -1 if count < start else start + (count - start) // every * every

    def _warm_up(self, state: ShampooState) -> None:
        """Compile the host solver in the worker now, not inside the first root job."""
        self._warmed_up = True
        stats, _, exponents = factor_lists(state.tensors, self.config)
        if stats:
            zeros = [np.zeros(s.shape, np.float32) for s in stats]
            self._pool().submit(self._run, zeros, zeros, exponents)

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="shampoo-roots"
            )
        return self._executor

    def _submit(self, state: ShampooState, count: int) -> None:
        stats, roots, exponents = factor_lists(state.tensors, self.config)
        if not stats:
            return
        stats, roots = jax.device_get((stats, roots))
        future = self._pool().submit(self._run, stats, roots, exponents)
        self._job = _Job(future, count)
        self._jobs += 1

    def _run(self, stats, roots, exponents) -> _JobResult:
        start = time.perf_counter()
        float64 = self.config.host_root_dtype == "float64"
        dtype = np.float64 if float64 else np.float32
        with jax.enable_x64(True) if float64 else contextlib.nullcontext():
            args = [[np.asarray(x, dtype) for x in xs] for xs in (stats, roots)]
            args = jax.device_put(args, jax.devices("cpu")[0])
            out = _compute_roots(*args, exponents=exponents, solver=self.config.root_solver)
            new_roots, failures, error = jax.device_get(out)
        seconds = time.perf_counter() - start
        return _JobResult(
            [np.asarray(r, np.float32) for r in new_roots], int(failures), float(error), seconds
        )

    def _swap(self, state: ShampooState) -> ShampooState:
        start = time.perf_counter()
        result = self._job.future.result()
        self._wait_seconds += time.perf_counter() - start
        self._last_seconds = result.seconds
        self._total_seconds += result.seconds
        _, old_roots, _ = factor_lists(state.tensors, self.config)
        roots = [_put_like(new, old) for new, old in zip(result.roots, old_roots)]
        if self.config.eigenbasis:  # the moments turn with the basis, on their devices
            tensors = _adopt_bases(state.tensors, roots, config=self.config)
            tensors = jax.tree.map(_placed_like, tensors, state.tensors)
        else:
            tensors = with_factor_roots(state.tensors, roots)
        self._failures += result.failures
        state = state._replace(
            tensors=tensors,
            roots_step=_put_like(self._job.submitted_at, state.roots_step),
            root_failures=_put_like(self._failures, state.root_failures),
            root_error=_put_like(result.error, state.root_error),
        )
        self._job = None
        return state
