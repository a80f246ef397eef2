"""Per-op times from a real `jax.profiler` trace of a compiled program.

The XLA runtimes record one trace event per executed HLO op, tagged with the module and op name
(`args.hlo_module`, `args.hlo_op`): XLA:CPU's thunk executor on the host threads, XLA:GPU/TPU on
the device timelines. This module runs a step function a few times under `jax.profiler.trace`,
reads the trace's Chrome-format `*.trace.json.gz`, keeps the leaf op events of one module, and
turns them into time per op per step. Ops that overlap (CPU thunks run concurrently on the
runtime's threads; GPU streams) share the overlapping wall time equally, so attributed times never
add up to more than the wall time they cover.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import pathlib
import tempfile
import time
from collections.abc import Callable

import jax


@dataclasses.dataclass(frozen=True)
class OpEvent:
    op: str
    start_us: float
    dur_us: float
    run: str
    lane: tuple[int, int]  # (pid, tid)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclasses.dataclass
class TraceTimes:
    """Time per op per step, from the traced runs of one module."""

    op_us: dict[str, float]  # mean exclusive time per step
    op_count: dict[str, float]  # mean executions per step
    span_us: float  # mean per-step span, first op start to last op end
    wall_us: float  # mean wall-clock per step as the host saw it (dispatch + wait)
    runs: int  # traced runs that had op events
    source: str  # which timeline the events came from, e.g. "/host:CPU"
    trace_file: str


def find_trace_file(logdir: str | pathlib.Path) -> pathlib.Path:
    files = sorted(pathlib.Path(logdir).rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(
            f"no *.trace.json.gz under {logdir}: jax.profiler wrote no trace (is another "
            "profiler session active in this process?)"
        )
    return files[-1]


def load_op_events(path: str | pathlib.Path, module: str) -> tuple[list[OpEvent], str]:
    """Leaf op events of `module`, preferring device timelines over host ones."""
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    process_names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    by_pid = collections.defaultdict(list)
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") != "X" or "hlo_op" not in args:
            continue
        if args.get("hlo_module", module) != module:
            continue
        by_pid[e["pid"]].append(
            OpEvent(
                args["hlo_op"],
                float(e["ts"]),
                float(e.get("dur", 0.0)),
                str(args.get("run_id", "")),
                (e["pid"], e.get("tid", 0)),
            )
        )
    if not by_pid:
        return [], ""
    device = [p for p in by_pid if process_names.get(p, "").startswith("/device:")]
    pids = device or list(by_pid)
    chosen = [ev for p in pids for ev in by_pid[p]]
    source = ", ".join(sorted({process_names.get(p, str(p)) for p in pids}))
    return _leaves(chosen), source


def _leaves(events: list[OpEvent]) -> list[OpEvent]:
    """Drop events that enclose other op events on the same lane (a while loop around its body)."""
    out = []
    by_lane = collections.defaultdict(list)
    for e in events:
        by_lane[e.lane].append(e)
    for lane_events in by_lane.values():
        lane_events.sort(key=lambda e: (e.start_us, -e.dur_us))
        for i, e in enumerate(lane_events):
            nxt = lane_events[i + 1] if i + 1 < len(lane_events) else None
            encloses = nxt is not None and nxt.start_us < e.end_us and nxt.end_us <= e.end_us
            if not encloses:
                out.append(e)
    return out


def exclusive_times(events: list[OpEvent]) -> dict[str, float]:
    """Total time per op, sharing the time where several ops run at once equally among them."""
    points = []
    for i, e in enumerate(events):
        points.append((e.start_us, 1, i))
        points.append((e.end_us, -1, i))
    points.sort(key=lambda p: (p[0], -p[1]))  # starts before ends: a 0-length event closes
    active: set[int] = set()
    totals: dict[str, float] = collections.defaultdict(float)
    last = None
    for t, kind, i in points:
        if active and last is not None and t > last:
            share = (t - last) / len(active)
            for j in active:
                totals[events[j].op] += share
        last = t
        if kind == 1:
            active.add(i)
        else:
            active.discard(i)
    return dict(totals)


def per_step_times(events: list[OpEvent], steps: int) -> tuple[dict, dict, float, int]:
    """(time per op, count per op, span) averaged over the traced runs."""
    runs = collections.defaultdict(list)
    for e in events:
        runs[e.run].append(e)
    if "" in runs and len(runs) == 1 and steps > 1:  # no run ids: treat the trace as one blob
        n_runs = steps
    else:
        n_runs = len(runs)
    times: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, float] = collections.defaultdict(float)
    span = 0.0
    for run_events in runs.values():
        for op, t in exclusive_times(run_events).items():
            times[op] += t / n_runs
        for e in run_events:
            counts[e.op] += 1 / n_runs
        span += (max(e.end_us for e in run_events) - min(e.start_us for e in run_events)) / n_runs
    return dict(times), dict(counts), span, n_runs


def trace_steps(
    run_step: Callable[[], object],
    module: str,
    *,
    steps: int = 3,
    logdir: str | None = None,
) -> TraceTimes:
    """Run `run_step()` (one step, blocking) `steps` times under the profiler and time its ops.

    Warm up (compile, first-run allocation) before calling this.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    logdir = logdir or tempfile.mkdtemp(prefix="bert_flax_profile_")
    wall = 0.0
    with jax.profiler.trace(logdir):
        for _ in range(steps):
            start = time.perf_counter()
            jax.block_until_ready(run_step())
            wall += time.perf_counter() - start
    path = find_trace_file(logdir)
    events, source = load_op_events(path, module)
    if not events:
        raise RuntimeError(
            f"the trace {path} holds no per-op events of HLO module {module!r}; this backend's "
            "runtime does not tag its op events with hlo_op/hlo_module"
        )
    op_us, op_count, span, runs = per_step_times(events, steps)
    return TraceTimes(op_us, op_count, span, wall / steps * 1e6, runs, source, str(path))
