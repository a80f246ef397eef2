"""Profile one compiled step: time per operation class, FLOPs, bytes and roofline placement.

    result = profile_step(step, state, batch, rng, update=lambda args, out: (out[0], *args[1:]))
    print(report.format_table(result))

Works for any jitted function; nothing here knows about BERT beyond the class names.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax

from bert_flax import hlo
from bert_flax.hlo import classify
from bert_flax.profile import ceilings as ceilings_lib
from bert_flax.profile import trace


@dataclasses.dataclass
class OpRecord:
    """One executed HLO op, per step."""

    name: str
    op_class: str
    reason: str
    time_ms: float
    count: float
    flops: float
    bytes: float
    transcendentals: float
    matmul_flops: float


@dataclasses.dataclass
class ClassStats:
    """Everything one operation class did in one step."""

    name: str
    time_ms: float
    flops: float
    bytes: float
    ops: int
    matmul_flops: float = 0.0  # the matrix-product part of `flops`

    @property
    def label(self) -> str:
        return classify.LABELS.get(self.name, self.name)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte (0 when the class moves no bytes)."""
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def flops_per_s(self) -> float:
        return self.flops / (self.time_ms * 1e-3) if self.time_ms > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / (self.time_ms * 1e-3) if self.time_ms > 0 else 0.0

    def ceiling_fraction(self, c: ceilings_lib.Ceilings | None) -> float | None:
        """Share of the roofline reached: achieved / min(peak, intensity x bandwidth).

        Equal to max(FLOP rate / peak FLOP rate, byte rate / peak byte rate).
        """
        if c is None or self.time_ms <= 0:
            return None
        return max(self.flops_per_s / c.flops_per_s, self.bytes_per_s / c.bytes_per_s)


@dataclasses.dataclass
class StepProfile:
    label: str
    module: str
    step_ms: float  # wall-clock per step as the host saw it, under the profiler
    span_ms: float  # first op start to last op end, per step
    # Wall-clock per step with steps dispatched back to back and one wait at the end, as the
    # training loop runs them (untraced): the next step's dispatch overlaps this step's run.
    pipelined_ms: float
    attributed_ms: float
    runs: int
    timeline: str
    classes: list[ClassStats]
    ops: list[OpRecord]
    ceilings: ceilings_lib.Ceilings | None
    xla_cost: dict[str, float]
    trace_file: str
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def unattributed_ms(self) -> float:
        """Step time no op event covers: `outside_span_ms` + `gaps_ms`."""
        return max(self.step_ms - self.attributed_ms, 0.0)

    @property
    def outside_span_ms(self) -> float:
        """Step time before the first op starts and after the last ends: dispatch (launching
        the program, transferring its arguments) and fetching the result."""
        return max(self.step_ms - self.span_ms, 0.0)

    @property
    def gaps_ms(self) -> float:
        """Time inside the ops' span when no op runs: the runtime between thunks."""
        return max(self.span_ms - self.attributed_ms, 0.0)

    @property
    def total_flops(self) -> float:
        return sum(c.flops for c in self.classes)

    @property
    def total_bytes(self) -> float:
        return sum(c.bytes for c in self.classes)

    def by_class(self) -> dict[str, ClassStats]:
        return {c.name: c for c in self.classes}

    def matmul_share(self) -> float:
        """Fraction of the step's time spent in matrix products."""
        t = sum(c.time_ms for c in self.classes if c.name in classify.MATMUL_CLASSES)
        return t / self.step_ms if self.step_ms else 0.0

    def non_matmul_share(self) -> float:
        """Fraction of the step's time in the other (non-matmul) classes."""
        t = sum(c.time_ms for c in self.classes if c.name not in classify.MATMUL_CLASSES)
        return t / self.step_ms if self.step_ms else 0.0

    def memory_bound_share(self) -> float | None:
        """Fraction of the step's time in non-matmul ops that the roofline calls memory-bound
        (arithmetic intensity below the ceilings' ridge); None without measured ceilings."""
        if self.ceilings is None or not self.step_ms:
            return None
        ridge = self.ceilings.ridge_intensity
        t = sum(
            op.time_ms
            for op in self.ops
            if op.op_class not in classify.MATMUL_CLASSES and op.flops < ridge * op.bytes
        )
        return t / self.step_ms


def analyse(
    module: hlo.HloModule,
    times: trace.TraceTimes,
    *,
    vocab_size: int | None = None,
) -> tuple[list[OpRecord], list[ClassStats]]:
    """Join trace times with HLO costs and classes."""
    records = []
    for costed in classify.costed_ops(module, module.executed_ops(), vocab_size=vocab_size):
        name, cost, c = costed.op.instruction.name, costed.cost, costed.op_class
        count = costed.op.count if costed.op.count is not None else times.op_count.get(name, 1.0)
        records.append(
            OpRecord(
                name,
                c.op_class,
                c.reason,
                times.op_us.get(name, 0.0) * 1e-3,
                count,
                cost.flops * count,
                cost.bytes * count,
                cost.transcendentals * count,
                cost.matmul_flops * count,
            )
        )
    known = {r.name for r in records}
    for name, us in times.op_us.items():
        if name not in known:  # a runtime op with no HLO instruction of that name
            records.append(OpRecord(name, "other", "not in the HLO", us * 1e-3, 1, 0, 0, 0, 0))
    stats: dict[str, ClassStats] = collections.OrderedDict()
    for name in classify.CLASSES:
        stats[name] = ClassStats(name, 0.0, 0.0, 0.0, 0)
    for r in records:
        s = stats[r.op_class]
        s.time_ms += r.time_ms
        s.flops += r.flops
        s.bytes += r.bytes
        s.matmul_flops += r.matmul_flops
        s.ops += 1
    return records, [s for s in stats.values() if s.ops]


def pipelined_step_ms(run_step: Callable[[], Any], steps: int) -> float:
    """Milliseconds per step of `steps` steps dispatched without waiting in between."""
    start = time.perf_counter()
    for _ in range(steps):
        out = run_step()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) * 1e3 / steps


def profile_step(
    fn: Callable,
    *args,
    steps: int = 3,
    warmup: int = 2,
    update: Callable[[tuple, Any], tuple] | None = None,
    vocab_size: int | None = None,
    ceilings: ceilings_lib.Ceilings | bool = True,
    matmul_dtype: str = "float32",
    label: str = "",
    logdir: str | None = None,
) -> StepProfile:
    """Compile `fn(*args)`, run it `warmup` + `steps` times and attribute the traced time.

    Args:
      fn: a `jax.jit`-wrapped function (plain functions are jitted here).
      update: `(args, outputs) -> next args`, to thread state through steps (needed when `fn`
        donates its inputs); by default every step reuses `args`.
      vocab_size: lets matrix products with a vocabulary-sized dimension land in the MLM head.
      ceilings: measured `Ceilings`, True to measure them here, False for none.
      matmul_dtype: dtype of the peak-FLOP/s measurement (the step's compute dtype).
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    compiled = jitted.lower(*args).compile()
    module = hlo.parse_module(compiled.as_text())
    state = {"args": tuple(args)}

    def run_step():
        out = compiled(*state["args"])
        if update is not None:
            state["args"] = tuple(update(state["args"], out))
        return out

    for _ in range(warmup):
        jax.block_until_ready(run_step())
    times = trace.trace_steps(run_step, module.name, steps=steps, logdir=logdir)
    pipelined_ms = pipelined_step_ms(run_step, steps)
    if ceilings is True:
        ceilings = ceilings_lib.measure(matmul_dtype)
    records, stats = analyse(module, times, vocab_size=vocab_size)
    return StepProfile(
        label=label,
        module=module.name,
        step_ms=times.wall_us * 1e-3,
        span_ms=times.span_us * 1e-3,
        pipelined_ms=pipelined_ms,
        attributed_ms=sum(r.time_ms for r in records),
        runs=times.runs,
        timeline=times.source,
        classes=stats,
        ops=sorted(records, key=lambda r: -r.time_ms),
        ceilings=ceilings or None,
        xla_cost=hlo.xla_cost_analysis(compiled),
        trace_file=times.trace_file,
    )
