"""Shampoo's asynchronous inverse roots and SOAP's eigenbases: host threads compute them off the
training step (:class:`ShampooHost`, :class:`SoapHost`; "roots" below stands for either).

With ``asynchronous=True`` the jitted update never computes roots. The train loop calls
``opt_state = optim.after_step(tx, opt_state, step)`` after every update, and the host:

1. when a job is in flight, swaps its roots into the state if it has finished (and
   ``swap_when_done``), or waits for it once it has been in flight ``max_staleness`` steps;
2. when the statistics after this update are due (the synchronous schedule: updates S, S + N,
   ...), copies them to host memory and submits them to a worker thread, which computes the roots
   with the same function as the graph (:func:`optim.shampoo_core.compute_roots`,
   :func:`optim.soap_core.compute_eigenbases`), jitted on the
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
from typing import Any, ClassVar, NamedTuple

import jax
import numpy as np

from optim.shampoo_core import (
    ShampooConfig,
    ShampooState,
    compute_roots,
    factor_lists,
    with_factor_roots,
)
from optim.soap_core import SoapState, adopt_bases, basis_lists, compute_eigenbases

# One jitted solver for all hosts: compiled once per solver settings and statistics shapes.
_compute_roots = jax.jit(compute_roots, static_argnames=("exponents", "solver"))
_compute_eigenbases = jax.jit(compute_eigenbases)
_adopt_bases = jax.jit(adopt_bases, static_argnames=("config",))


class _JobResult(NamedTuple):
    roots: list[np.ndarray]
    failures: int
    error: float
    seconds: float


class _Job(NamedTuple):
    future: concurrent.futures.Future
    submitted_at: int  # the update count whose statistics it uses


def find_state(opt_state: Any, kind: type) -> Any:
    """The one state of type ``kind`` inside ``opt_state`` (which may be any wrapper's state)."""
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kind))
    found = [x for x in leaves if isinstance(x, kind)]
    if len(found) != 1:
        raise ValueError(
            f"Expected exactly one {kind.__name__} in the optimizer state, found {len(found)}; "
            "pass the opt_state of the transformation optim.create returned (or of a wrapper "
            "around it)."
        )
    return found[0]


def _replace_state(opt_state: Any, new: Any) -> Any:
    kind = type(new)
    return jax.tree.map(
        lambda x: new if isinstance(x, kind) else x,
        opt_state,
        is_leaf=lambda x: isinstance(x, kind),
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


class RefreshHost:
    """The host side of one transformation whose factor statistics are solved for matrices on a
    host thread (see the module doc); a subclass says which matrices and where they go."""

    state_type: ClassVar[type]
    thread_name: ClassVar[str]

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
        state = self.find_state(opt_state) if resync else None
        if resync:
            self._resync(state, step)
        self._last_step = step
        if not any(self._due(step + self._count_offset)):
            return opt_state  # the common case: no device array touched, no tree rebuilt
        if state is None:
            state = self.find_state(opt_state)
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
        return _replace_state(opt_state, state)

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
        state = self.find_state(opt_state)
        count, (roots_step, failures) = jax.device_get((state.count, self._refreshed(state)))
        metrics = {
            "shampoo/root_failures": float(failures),
            **self._state_metrics(state),
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

    def find_state(self, opt_state: Any) -> Any:
        """This transformation's state inside ``opt_state``."""
        return find_state(opt_state, self.state_type)

    # -- what a subclass says ------------------------------------------------------------------
    def factors(self, tensors: Any) -> tuple[list, list, tuple]:
        """The state's statistics and the matrices in use, flat, and the exponents ``solve``
        takes for them (Shampoo's roots' p; () for SOAP's eigenbases, which have none)."""
        raise NotImplementedError

    def solve(self, stats: list, current: list, exponents: tuple) -> tuple[list, Any, Any]:
        """New matrices from ``factors``' lists (the jitted function of the graph):
        ``(matrices, failures, max_error)``."""
        raise NotImplementedError

    def _refreshed(self, state: Any) -> tuple[Any, Any]:
        """The state's (update whose statistics the matrices in use come from, failures)."""
        raise NotImplementedError

    def _with_refresh(self, state: Any, matrices: list, step, failures, error) -> Any:
        """``state`` with new matrices (placed as the old ones) and bookkeeping (placed)."""
        raise NotImplementedError

    def _state_metrics(self, state: Any) -> dict[str, float]:
        return {}

    # -- internals -----------------------------------------------------------------------------
    def _resync(self, state: Any, step: int) -> None:
        """Drop any job and read the count (and roots bookkeeping) from the state."""
        self.reset()
        count, roots_step, failures = (
            int(x) for x in jax.device_get((state.count, *self._refreshed(state)))
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

    def _warm_up(self, state: Any) -> None:
        """Compile the host solver in the worker now, not inside the first root job."""
        self._warmed_up = True
        stats, _, exponents = self.factors(state.tensors)
        if stats:
            zeros = [np.zeros(s.shape, np.float32) for s in stats]
            self._pool().submit(self._run, zeros, zeros, exponents)

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=self.thread_name
            )
        return self._executor

    def _submit(self, state: Any, count: int) -> None:
        stats, roots, exponents = self.factors(state.tensors)
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
            new_roots, failures, error = jax.device_get(self.solve(*args, exponents))
        seconds = time.perf_counter() - start
        return _JobResult(
            [np.asarray(r, np.float32) for r in new_roots], int(failures), float(error), seconds
        )

    def _swap(self, state: Any) -> Any:
        start = time.perf_counter()
        result = self._job.future.result()
        self._wait_seconds += time.perf_counter() - start
        self._last_seconds = result.seconds
        self._total_seconds += result.seconds
        _, old, _ = self.factors(state.tensors)
        matrices = [_put_like(new, like) for new, like in zip(result.roots, old)]
        self._failures += result.failures
        state = self._with_refresh(
            state, matrices, self._job.submitted_at, self._failures, result.error
        )
        self._job = None
        return state


class ShampooHost(RefreshHost):
    """The host side of one Shampoo transformation: its inverse roots."""

    state_type = ShampooState
    thread_name = "shampoo-roots"

    def factors(self, tensors: Any) -> tuple[list, list, tuple]:
        return factor_lists(tensors, self.config)

    def solve(self, stats: list, current: list, exponents: tuple) -> tuple[list, Any, Any]:
        return _compute_roots(stats, current, exponents=exponents, solver=self.config.root_solver)

    def _refreshed(self, state: ShampooState) -> tuple[Any, Any]:
        return state.roots_step, state.root_failures

    def _with_refresh(self, state: ShampooState, matrices, step, failures, error) -> ShampooState:
        return state._replace(
            tensors=with_factor_roots(state.tensors, matrices),
            roots_step=_put_like(step, state.roots_step),
            root_failures=_put_like(failures, state.root_failures),
            root_error=_put_like(error, state.root_error),
        )

    def _state_metrics(self, state: ShampooState) -> dict[str, float]:
        return {"shampoo/root_error": float(jax.device_get(state.root_error))}


class SoapHost(RefreshHost):
    """The host side of one SOAP transformation: its eigenbases (Adam's moments turned into
    each new basis on their devices)."""

    state_type = SoapState
    thread_name = "soap-eigenbases"

    def factors(self, tensors: Any) -> tuple[list, list, tuple]:
        return (*basis_lists(tensors), ())

    def solve(self, stats: list, current: list, exponents: tuple) -> tuple[list, Any, Any]:
        del exponents  # (none: an eigenbasis has no exponent)
        bases, failures = _compute_eigenbases(stats, current)
        return bases, failures, 0.0

    def _refreshed(self, state: SoapState) -> tuple[Any, Any]:
        return state.bases_step, state.basis_failures

    def _with_refresh(self, state: SoapState, matrices, step, failures, error) -> SoapState:
        del error  # (none: eigh has no error estimate)
        tensors = _adopt_bases(state.tensors, matrices, config=self.config)
        return state._replace(
            tensors=jax.tree.map(_placed_like, tensors, state.tensors),
            bases_step=_put_like(step, state.bases_step),
            basis_failures=_put_like(failures, state.basis_failures),
        )
