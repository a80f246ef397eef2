"""What one compile of a run's steps says against a chip (`Report`): memory per device, FLOPs,
the collectives, and a roofline per op class; every time in it is a prediction, not a
measurement.

    report = compile_for(configs.bert_base.get_config("phase2"), targets.target("v5e-8"))
    print(report.fits, report.roofline_step_s)
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_flax import hlo
from bert_flax.aot import packings, targets
from bert_flax.aot import program as program_lib
from bert_flax.hlo import classify
from bert_flax.train import setup as train_setup

GIB = targets.GIB


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device of one compiled step (`compiled.memory_analysis()`)."""

    arguments: int
    outputs: int
    aliased: int  # outputs written in place of donated arguments (the train state)
    temporaries: int
    code: int

    @property
    def total(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    @classmethod
    def of(cls, compiled: Any) -> Memory:
        m = compiled.memory_analysis()
        return cls(
            m.argument_size_in_bytes,
            m.output_size_in_bytes,
            m.alias_size_in_bytes,
            m.temp_size_in_bytes,
            m.generated_code_size_in_bytes,
        )


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    count: int  # executions per step (loop bodies times their trip counts)
    bytes: float  # per device per step: the larger of operand and result, summed over executions


@dataclasses.dataclass(frozen=True)
class TopOp:
    """One executed op of a class, by its predicted time per device per step."""

    name: str  # the HLO op or fusion
    computes: str  # its root opcode, result and operands (shapes, dtypes)
    source: str  # where in the model: the flax module path of its largest named instruction
    flops: float
    bytes: float
    seconds: float
    count: int  # executions per step


@dataclasses.dataclass(frozen=True)
class OpClassCost:
    """Roofline of one op class (`hlo.classify`) per device per step."""

    flops: float
    bytes: float
    seconds: float  # sum over its ops of max(FLOPs / peak, bytes / HBM bandwidth)
    top: tuple[TopOp, ...] = ()  # its costliest ops (`TOP_OPS` of them), costliest first


TOP_OPS = 5


@dataclasses.dataclass
class Report:
    """What one compile says of a config on a target. Per device unless the name says step."""

    target: str
    devices: int
    mesh: dict[str, int]
    model: dict[str, Any]
    rows_per_step: int
    accumulation: int
    packing_factor: float
    compile_s: dict[str, float]
    train_memory: Memory
    eval_memory: Memory | None  # None: the eval step was not compiled
    hbm_bytes: float
    param_bytes: int
    optimizer_bytes: int
    xla_flops: float  # XLA's cost analysis of the train step (None on CUDA: HLO count instead)
    hlo_flops: float  # counted from the compiled program's shapes (`bert_flax.hlo`)
    model_flops_per_step: float  # 6 x parameters x tokens + attention, all devices
    collectives: list[Collective]
    classes: dict[str, OpClassCost]
    link_bytes_per_s: float
    peak_flops: float
    # Custom kernels the roofline charges no FLOPs (`hlo.kernel_flops` knows none of them).
    uncounted_kernels: list[str] = dataclasses.field(default_factory=list)
    # The share of dense attention the block-skipping kernels (packed_tpu, packed_gpu) are
    # charged: what they visit of the packing's rows (`attention_visited_fraction`).
    attention_visited_fraction: float = 1.0
    # The share of dense attention's scores the rows' sequences need (the sum of li^2 over L^2):
    # the attention FLOPs `model_flops_per_step` counts.
    attention_needed_fraction: float = 1.0

    @property
    def peak_memory(self) -> int:
        """The larger step's bytes a device (the eval step's, if compiled, or the train step's)."""
        return max(m.total for m in (self.train_memory, self.eval_memory) if m is not None)

    @property
    def fits(self) -> bool:
        return self.peak_memory <= self.hbm_bytes

    @property
    def collective_bytes(self) -> float:
        return sum(c.bytes for c in self.collectives)

    @property
    def roofline_step_s(self) -> float:
        """Predicted seconds per step: every op at its roofline bound, collectives at the link's
        bandwidth, nothing overlapped (an upper bound of the roofline's own kind)."""
        compute = sum(c.seconds for c in self.classes.values())
        return compute + self.collective_bytes / self.link_bytes_per_s

    @property
    def sequences_per_s(self) -> float:
        return self.rows_per_step * self.packing_factor / self.roofline_step_s

    @property
    def model_flops_utilisation(self) -> float:
        return self.model_flops_per_step / (self.roofline_step_s * self.peak_flops * self.devices)

    def as_dict(self) -> dict[str, Any]:
        """Every field, and every property (the derived figures; the predicted ones named)."""
        out = dataclasses.asdict(self)
        for name in ("train_memory", "eval_memory"):
            if out[name] is not None:
                out[name]["total"] = getattr(self, name).total
        derived = [k for k, v in vars(Report).items() if isinstance(v, property)]
        out.update({name: getattr(self, name) for name in derived})
        out["predicted"] = ["roofline_step_s", "sequences_per_s", "model_flops_utilisation"]
        return out


def _bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of the abstract arrays in `tree` (their shard shapes)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
    return total


def collectives(module: hlo.HloModule) -> list[Collective]:
    """The collectives the compiled program executes per step, by kind."""
    count: dict[str, int] = collections.Counter()
    moved: dict[str, float] = collections.Counter()
    for op in module.executed_ops():
        outer = op.instruction
        # TPU writes a reduce-scatter as a fusion calling "all-reduce-scatter": one collective.
        scatter = any(c.startswith("all-reduce-scatter") for c in outer.called)
        for inst in [outer] if scatter else module.fused_instructions(outer):
            kind = "reduce-scatter" if scatter else hlo.collective_kind(inst.opcode)
            if kind is None or inst.opcode.endswith("-done"):
                continue
            operands = [module.instructions[o].shape for o in inst.operands]
            largest = max(a.bytes for s in (inst.shape, *operands) for a in s.arrays())
            count[kind] += op.count or 1
            moved[kind] += (op.count or 1) * largest
    return [Collective(k, count[k], moved[k]) for k in sorted(count)]


def roofline_by_class(
    module: hlo.HloModule, chip: targets.Chip, vocab_size: int, visited: float = 1.0
) -> dict[str, OpClassCost]:
    """`OpClassCost` per op class: each executed op at max(FLOPs / peak, bytes / bandwidth), the
    block-skipping attention at the `visited` share of its block pairs (`hlo.kernel_flops`).
    Collectives are timed at the interconnect's bandwidth (`Report.roofline_step_s`), not here."""

    def seconds(inst: hlo.HloInstruction, cost: hlo.OpCost) -> float:
        if hlo.collective_kind(inst.opcode):
            return 0.0
        return max(cost.flops / chip.peak_flops, cost.bytes / chip.hbm_bytes_per_s)

    def branch_cost(inst: hlo.HloInstruction) -> tuple[float, float]:
        """(FLOPs on arrays, not scalars; roofline seconds): a conditional by the branch a finite
        step takes (`HloModule.executed_ops`)."""
        cost = hlo.op_cost(module, inst, visited)
        on_arrays = any(a.size > 1 for a in inst.shape.arrays())
        return (cost.flops if on_arrays else 0.0), seconds(inst, cost)

    executed = module.executed_ops(branch_cost=branch_cost)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    ops: dict[str, list[TopOp]] = collections.defaultdict(list)
    for costed in classify.costed_ops(module, executed, vocab_size=vocab_size, visited=visited):
        inst, cost, times = costed.op.instruction, costed.cost, costed.op.count or 1
        spent = seconds(inst, cost) * times
        if not spent:
            continue
        entry = totals[costed.op_class.op_class]
        entry[0] += cost.flops * times
        entry[1] += cost.bytes * times
        entry[2] += spent
        ops[costed.op_class.op_class].append(_top_op(module, inst, cost, spent, times))
    return {
        name: OpClassCost(
            *totals[name], top=tuple(sorted(ops[name], key=lambda o: -o.seconds)[:TOP_OPS])
        )
        for name in classify.CLASSES
        if name in totals
    }


def _top_op(
    module: hlo.HloModule, inst: hlo.HloInstruction, cost: hlo.OpCost, seconds: float, count: int
) -> TopOp:
    inner = [i for i in module.fused_instructions(inst) if i.opcode not in hlo.FREE_OPCODES]
    root = next((i for i in inner if i.is_root), inner[-1] if inner else inst)
    operands = ", ".join(str(module.instructions[o].shape) for o in inst.operands[:4])
    more = ", ..." if len(inst.operands) > 4 else ""
    # The deepest module path inside, the largest op of it: where in the model the op is.
    paths = [(classify.op_name_parts(i.op_name), i.shape.size) for i in inner if i.op_name]
    (tokens, primitive), _ = max(paths, key=lambda p: (len(p[0][0]), p[1]), default=(([], ""), 0))
    source = "/".join([*tokens, primitive]) if primitive else ""
    return TopOp(
        name=inst.name,
        computes=f"{root.opcode} -> {inst.shape} <- ({operands}{more})",
        source=source,
        flops=cost.flops * count,
        bytes=cost.bytes * count,
        seconds=seconds,
        count=count,
    )


def model_flops_per_step(
    params: Any, model_config: Any, rows: int, row_shape: Any, attention_needed: float = 1.0
) -> float:
    """Training FLOPs of a step by the usual count (Kaplan et al., 2020): 6 x parameters x
    tokens for the weights a token multiplies (all but the embedding tables), the masked-LM
    decoder (the word table, transposed) on the row's prediction slots only, and attention's
    scores and weighted sum at 12 x layers x hidden x length a token times `attention_needed`,
    the share of a row's scores its sequences need (the sum of li^2 over L^2: the useful work,
    whatever a kernel computes of the masked rest)."""
    tables = {"word_embeddings", "position_embeddings", "token_type_embeddings"}
    weights = sum(
        int(np.prod(leaf.shape))
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        if not tables & {getattr(k, "key", None) for k in path}
    )
    length, cfg = row_shape.max_seq_length, model_config
    per_token = 6 * weights + 12 * cfg.num_layers * cfg.hidden_size * length * attention_needed
    decoder = 6 * cfg.vocab_size * cfg.hidden_size * row_shape.max_predictions_per_pack
    return float(rows * (per_token * length + decoder))


def report(compiled: program_lib.Compiled, target: targets.Target) -> Report:
    """Reads the compiled steps against `target`'s chip (see `Report`)."""
    program, chip = compiled.program, target.chip
    module = hlo.parse_module(compiled.train.as_text())
    visited = compiled.attention_visited_fraction
    classes = roofline_by_class(module, chip, program.model_config.vocab_size, visited)
    state = program.abstract_state
    num_params = train_setup.parameter_count(state.params)
    rows, length = program.adjustment.batch_size, program.task.row_shape.max_seq_length
    cfg = program.model_config
    return Report(
        target=target.name,
        devices=program.mesh.size,
        mesh=dict(program.mesh.shape),
        model={
            "layers": cfg.num_layers,
            "hidden": cfg.hidden_size,
            "parameters": num_params,
            "length": length,
            "attention": program.attention_impl,
            "optimizer": program.config.optimizer.name,
            "dtype": str(cfg.dtype),
            "packed": bool(program.config.data.packed),
        },
        rows_per_step=rows,
        accumulation=program.adjustment.accumulation,
        packing_factor=program.adjustment.packing_factor,
        compile_s=compiled.seconds,
        train_memory=Memory.of(compiled.train),
        eval_memory=None if compiled.eval is None else Memory.of(compiled.eval),
        hbm_bytes=chip.hbm_bytes,
        param_bytes=_bytes_per_device(state.params),
        optimizer_bytes=_bytes_per_device(state.opt_state),
        xla_flops=hlo.xla_cost_analysis(compiled.train).get("flops"),
        hlo_flops=sum(c.flops for c in classes.values()),
        model_flops_per_step=model_flops_per_step(
            state.params, cfg, rows, program.task.row_shape, compiled.attention_needed_fraction
        ),
        collectives=collectives(module),
        classes=classes,
        link_bytes_per_s=chip.link_bytes_per_s,
        peak_flops=chip.peak_flops,
        uncounted_kernels=hlo.uncounted_kernels(module),
        attention_visited_fraction=visited,
        attention_needed_fraction=compiled.attention_needed_fraction,
    )


def compile_for(
    config: ml_collections.ConfigDict,
    target: targets.Target,
    packing_factor: float | None = None,
    devices: list[jax.Device] | None = None,
    **fractions: float,
) -> Report:
    """`report(compile_steps(...))` on compile-only devices of `target`; `fractions`: the
    attention fractions `compile_steps` takes."""
    devices = targets.compile_only_devices(target) if devices is None else devices
    steps = program_lib.compile_steps(config, devices, packing_factor, **fractions)
    return report(steps, target)


def format_report(r: Report, largest: int | None = None, top_classes: int = 6) -> str:
    """The report as a person reads it (every time a roofline prediction), with the costliest
    ops of its `top_classes` costliest classes."""
    m = r.model
    t, e = r.train_memory, r.eval_memory
    over = r.peak_memory - r.hbm_bytes
    evaluation = f"eval step {e.total / GIB:.2f} GiB" if e else "eval step not compiled"
    verdict = "fits" if r.fits else f"does NOT fit (by {over / GIB:.2f} GiB)"
    lines = [
        f"{m['layers']}-layer, hidden {m['hidden']}, {m['parameters'] / 1e6:.1f}M parameters, "
        f"length {m['length']}, {'packed' if m['packed'] else 'padded'} "
        f"(factor {r.packing_factor:.3f}), {m['optimizer']}, attention={m['attention']}, "
        f"{m['dtype']}",
        f"on {r.target}: {r.devices} devices, mesh {r.mesh}; {r.rows_per_step} rows a step in "
        f"{r.accumulation} micro-batch(es)",
        f"compile: train {r.compile_s['train']:.1f} s, eval {r.compile_s['eval']:.1f} s "
        f"(tracing {r.compile_s['trace']:.1f} s)",
        "",
        f"HBM per device ({r.hbm_bytes / GIB:.1f} GiB): train step {t.total / GIB:.2f} GiB "
        f"(arguments {t.arguments / GIB:.2f}, outputs {t.outputs / GIB:.2f}, in place "
        f"{t.aliased / GIB:.2f}, temporaries {t.temporaries / GIB:.2f}, code "
        f"{t.code / GIB:.3f}); {evaluation}: {verdict}",
        f"  parameters {r.param_bytes / GIB:.3f} GiB, optimizer state "
        f"{r.optimizer_bytes / GIB:.3f} GiB per device",
        f"FLOPs per device per step: XLA {_num(r.xla_flops)}, counted {_num(r.hlo_flops)}; "
        f"model FLOPs per step (all devices) {_num(r.model_flops_per_step)}",
        "collectives per device per step: "
        + (
            ", ".join(f"{c.kind} x{c.count} ({c.bytes / 2**20:.1f} MiB)" for c in r.collectives)
            or "none"
        ),
    ]
    if m["attention"] in packings.SKIPPING_ATTENTION:
        lines.append(
            f"attention ({m['attention']}) charged {r.attention_visited_fraction:.3f} of dense "
            "attention: the block pairs it visits in the packing's rows"
        )
    lines += ["", "predicted (roofline, per device):"]
    ranked = sorted(r.classes.items(), key=lambda kv: -kv[1].seconds)
    for name, c in ranked:
        lines.append(
            f"  {name:<18} {c.seconds * 1e3:9.3f} ms  {_num(c.flops)} FLOPs  {_num(c.bytes)} B"
        )
    lines.append(f"  {'collectives':<18} {r.collective_bytes / r.link_bytes_per_s * 1e3:9.3f} ms")
    lines.append(
        f"step {r.roofline_step_s * 1e3:.2f} ms -> {r.sequences_per_s:,.0f} sequences/s, "
        f"model FLOPs utilisation {r.model_flops_utilisation:.0%} (prediction)"
    )
    if largest is not None:
        lines.append(f"largest batch that fits: {largest} rows a step")
    if r.uncounted_kernels:
        lines.append(
            f"WARNING: custom kernels charged no FLOPs (the step is predicted too fast): "
            f"{', '.join(r.uncounted_kernels)}"
        )
    lines += ["", f"costliest ops of the {top_classes} costliest classes (predicted, per device):"]
    for name, c in ranked[:top_classes]:
        lines.append(f"  {name}:")
        for op in c.top:
            lines.append(
                f"    {op.seconds * 1e3:7.3f} ms  {_num(op.bytes)} B  {_num(op.flops)} FLOPs  "
                f"x{op.count}  {op.name}: {op.computes}"
            )
            if op.source:
                lines.append(f"{'':12}at {op.source}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
