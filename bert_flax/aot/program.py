"""A run's train and eval steps compiled ahead of time for an accelerator this host lacks.

`compile_for(config, target)` builds exactly what `create_train_setup` builds (the config's
rules, optimizer, attention back-end, packed row shapes, micro-batching) over compile-only devices
of a `targets.Target`, from abstract shapes only (`jax.ShapeDtypeStruct`s carrying shardings: no
parameter, no batch, no device memory), compiles both steps, and reads what XLA says of the
program: memory per device, FLOPs, the collectives it holds; `Report` sets them against the
chip's figures. Every time in it is a prediction from the roofline, not a measurement:

    report = compile_for(configs.bert_base.get_config("phase2"), targets.target("v5e-8"))
    print(report.fits, report.roofline_step_s)

`largest_batch` bisects over compiles for the most rows per step that fit.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental.compilation_cache import compilation_cache

import packing
from bert_flax import sharding
from bert_flax.aot import targets
from bert_flax.input_pipeline import synthetic
from bert_flax.kernels import block_ranges
from bert_flax.profile import classify, hlo
from bert_flax.train import setup as train_setup

GIB = targets.GIB

# Executed ops whose bytes cross the interconnect; `-done` halves of async pairs move nothing.
_COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "ragged-all-to-all",
)


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
    """Roofline of one op class (`profile.classify`) per device per step."""

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
    hlo_flops: float  # counted from the compiled program's shapes (`profile.hlo`)
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

    @property
    def fits(self) -> bool:
        steps = [m for m in (self.train_memory, self.eval_memory) if m is not None]
        return max(m.total for m in steps) <= self.hbm_bytes

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
        out = dataclasses.asdict(self)
        for name in ("train_memory", "eval_memory"):
            if out[name] is not None:
                out[name]["total"] = getattr(self, name).total
        derived = ("fits", "collective_bytes", "roofline_step_s", "sequences_per_s")
        out.update({name: getattr(self, name) for name in derived})
        out["model_flops_utilisation"] = self.model_flops_utilisation
        out["predicted"] = ["roofline_step_s", "sequences_per_s", "model_flops_utilisation"]
        return out


def abstract_batch(task: Any, rows: int, mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """Shapes and dtypes of a global batch of `rows`, sharded as the loop shards batches."""
    example = task.synthetic_batch(1, seed=0)
    batch_sharding = sharding.batch_sharding(mesh)
    return {
        name: jax.ShapeDtypeStruct(
            (rows, *np.shape(v)[1:]), np.asarray(v).dtype, sharding=batch_sharding
        )
        for name, v in example.items()
    }


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
            kind = "reduce-scatter" if scatter else inst.opcode.removesuffix("-start")
            if kind not in _COLLECTIVE_KINDS:
                continue
            operands = [module.instructions[o].shape for o in inst.operands]
            largest = max(a.bytes for s in (inst.shape, *operands) for a in s.arrays())
            count[kind] += op.count or 1
            moved[kind] += (op.count or 1) * largest
    return [Collective(k, count[k], moved[k]) for k in sorted(count)]


def roofline_by_class(
    module: hlo.HloModule, chip: targets.Chip, vocab_size: int, visited: float = 1.0
):
    """`OpClassCost` per op class: each executed op at max(FLOPs / peak, bytes / bandwidth), the
    block-skipping attention at the `visited` share of its block pairs (`hlo.kernel_flops`)."""

    def cost_of(inst: hlo.HloInstruction) -> tuple[float, float]:
        """(FLOPs on arrays, not scalars; roofline seconds). Collectives are timed at the
        interconnect's bandwidth (`Report.roofline_step_s`), not here."""
        if inst.opcode.removesuffix("-start").removesuffix("-done") in _COLLECTIVE_KINDS:
            return 0.0, 0.0
        cost = hlo.op_cost(module, inst, visited)
        seconds = max(cost.flops / chip.peak_flops, cost.bytes / chip.hbm_bytes_per_s)
        on_arrays = any(a.size > 1 for a in inst.shape.arrays())
        return (cost.flops if on_arrays else 0.0), seconds

    # A conditional by the branch a finite step takes (`HloModule.executed_ops`).
    executed = module.executed_ops(branch_cost=cost_of)
    classes = classify.Classifier(module, vocab_size=vocab_size).classify(executed)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    ops: dict[str, list[TopOp]] = collections.defaultdict(list)
    for op in executed:
        inst = op.instruction
        seconds = cost_of(inst)[1]
        if not seconds:
            continue
        cost = hlo.op_cost(module, inst, visited)
        times = op.count or 1
        name = classes[inst.name].op_class
        entry = totals[name]
        entry[0] += cost.flops * times
        entry[1] += cost.bytes * times
        entry[2] += seconds * times
        ops[name].append(_top_op(module, inst, cost, seconds * times, times))
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


def uncounted_kernels(module: hlo.HloModule) -> list[str]:
    """The executed custom calls that compute something the roofline cannot count."""
    return sorted(
        {
            inst.custom_call_target
            for op in module.executed_ops()
            for inst in module.fused_instructions(op.instruction)
            if inst.opcode == "custom-call"
            and inst.custom_call_target not in hlo.FREE_CUSTOM_CALLS
            and hlo.kernel_flops(module, inst) is None
        }
    )


def parameter_count(params: Any) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))


def model_flops_per_step(params: Any, model_config: Any, rows: int, row_shape: Any) -> float:
    """Training FLOPs of a step by the usual count (Kaplan et al., 2020): 6 x parameters x
    tokens for the weights a token multiplies (all but the embedding tables), the masked-LM
    decoder (the word table, transposed) on the row's prediction slots only, and attention's
    scores and weighted sum at 12 x layers x hidden x length a token (every position of a row,
    packed or padded, as the kernels compute them)."""
    tables = {"word_embeddings", "position_embeddings", "token_type_embeddings"}
    weights = sum(
        int(np.prod(leaf.shape))
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        if not tables & {getattr(k, "key", None) for k in path}
    )
    length, cfg = row_shape.max_seq_length, model_config
    per_token = 6 * weights + 12 * cfg.num_layers * cfg.hidden_size * length
    decoder = 6 * cfg.vocab_size * cfg.hidden_size * row_shape.max_predictions_per_pack
    return float(rows * (per_token * length + decoder))


def _xla_flops(compiled: Any) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return None if not cost or "flops" not in cost else float(cost["flops"])


@contextlib.contextmanager
def _no_persistent_cache():
    """Compile-only executables cannot be read back from jax's persistent compilation cache
    (each try warns), so programs compiled here are kept out of it."""
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # the cache decides once whether it is on; ask it again
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


@dataclasses.dataclass
class Compiled:
    """The compiled steps of a config on a target and the program they came from."""

    program: train_setup.TrainProgram
    train: Any
    eval: Any  # None when not asked for
    seconds: dict[str, float]
    attention_visited_fraction: float = 1.0  # `Report.attention_visited_fraction`


def compile_steps(
    config: ml_collections.ConfigDict,
    devices: list[jax.Device],
    packing_factor: float | None = None,
    *,
    evaluate: bool = True,
    attention_visited_fraction: float = 1.0,
) -> Compiled:
    """Compiles the train step of `config` (and its eval step, if `evaluate`) for `devices`
    (compile-only ones are enough); the roofline will charge the block-skipping attention
    `attention_visited_fraction` of dense attention (see the function of that name)."""
    mesh = sharding.mesh_of(config.mesh, devices)
    started = time.perf_counter()
    program = train_setup.create_train_program(config, mesh, packing_factor_override=packing_factor)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding.replicated(mesh))
    batch = abstract_batch(program.task, program.adjustment.batch_size, mesh)
    eval_batch = abstract_batch(program.task, config.eval.batch_size, mesh)
    with _no_persistent_cache():
        traced = time.perf_counter()
        train = program.train_step.lower(program.abstract_state, batch, key).compile()
        compiled = time.perf_counter()
        params = program.abstract_state.params
        eval_step = program.eval_step.lower(params, eval_batch).compile() if evaluate else None
    seconds = {
        "trace": traced - started,
        "train": compiled - traced,
        "eval": time.perf_counter() - compiled,
    }
    return Compiled(program, train, eval_step, seconds, attention_visited_fraction)


def report(compiled: Compiled, target: targets.Target) -> Report:
    """Reads the compiled steps against `target`'s chip (see `Report`)."""
    program, chip = compiled.program, target.chip
    module = hlo.parse_module(compiled.train.as_text())
    visited = compiled.attention_visited_fraction
    classes = roofline_by_class(module, chip, program.model_config.vocab_size, visited)
    state = program.abstract_state
    num_params = parameter_count(state.params)
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
        xla_flops=_xla_flops(compiled.train),
        hlo_flops=sum(c.flops for c in classes.values()),
        model_flops_per_step=model_flops_per_step(state.params, cfg, rows, program.task.row_shape),
        collectives=collectives(module),
        classes=classes,
        link_bytes_per_s=chip.link_bytes_per_s,
        peak_flops=chip.peak_flops,
        uncounted_kernels=uncounted_kernels(module),
        attention_visited_fraction=visited,
    )


def compile_for(
    config: ml_collections.ConfigDict,
    target: targets.Target,
    packing_factor: float | None = None,
    devices: list[jax.Device] | None = None,
    attention_visited_fraction: float = 1.0,
) -> Report:
    """`report(compile_steps(...))` on compile-only devices of `target`."""
    devices = targets.compile_only_devices(target) if devices is None else devices
    steps = compile_steps(
        config, devices, packing_factor, attention_visited_fraction=attention_visited_fraction
    )
    return report(steps, target)


def largest_batch(
    config: ml_collections.ConfigDict,
    target: targets.Target,
    packing_factor: float | None = None,
    *,
    limit: int = 1 << 16,
    attention_visited_fraction: float = 1.0,
) -> tuple[int, Report | None]:
    """The most rows per step (a multiple of the data shards, no accumulation) whose train and
    eval steps fit the chip's HBM, by bisection over compiles, and the report at it (0, None:
    not even one row a shard fits). The config's packing adjustment is turned off so that the
    rows are the ones compiled."""
    devices = targets.compile_only_devices(target)
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.packing_hparams, config.train.accumulation = "none", 1
    shards = sharding.data_parallel_size(sharding.mesh_of(config.mesh, devices))
    reports: dict[int, Report] = {}

    def fits(units: int) -> bool:
        config.train.batch_size = config.eval.batch_size = units * shards
        report = reports[units] = compile_for(
            config, target, packing_factor, devices, attention_visited_fraction
        )
        peak = max(m.total for m in (report.train_memory, report.eval_memory) if m is not None)
        logging.info(
            "largest batch: %d rows %s (HBM %.2f of %.2f GiB a device; compiled in %.0f s)",
            units * shards,
            "fit" if report.fits else "do not fit",
            peak / targets.GIB,
            target.chip.hbm_bytes / targets.GIB,
            sum(report.compile_s.values()),
        )
        return report.fits

    low, high = 0, 1  # fits(low) (or low == 0); find the first high that does not fit
    while high * shards <= limit and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low * shards, reports.get(low)


# The named packings `--packing_factor` takes: the length histogram (at the config's length) the
# config's packer packs. corpus_like: `packing.synthetic.corpus_like_histogram`, the figures of a
# real Wikipedia histogram at 128 and 512 (stretched past them); web_like: the bundled long-context
# `lognormal_web` histogram (1,024-8,192; a web-like corpus of log-normal document lengths,
# documents longer than the row split, packing/data/README.md), the long-context rows' packing.
PACKINGS: dict[str, Callable[[int], np.ndarray]] = {
    "corpus_like": lambda length: packing.synthetic.corpus_like_histogram(1_000_000, length),
    "web_like": lambda length: packing.histogram.long_context_histogram("lognormal_web", length),
}


def _named_packing(config: ml_collections.ConfigDict, spec: str) -> packing.StrategySet:
    """The config's packer (`data.algorithm`, `data.max_sequences_per_pack`; padded: one sequence
    a row) on the `PACKINGS[spec]` histogram at the config's length."""
    data = config.data
    if not data.packed:
        return _pack(spec, data.max_seq_length, "none", 1)
    return _pack(spec, data.max_seq_length, data.algorithm, data.max_sequences_per_pack)


@functools.cache  # the packing factor and the attention fractions all read it
def _pack(spec: str, length: int, algorithm: str, depth: int) -> packing.StrategySet:
    return packing.pack_histogram(PACKINGS[spec](length), length, algorithm, depth)


def packing_factor(config: ml_collections.ConfigDict, spec: str) -> float | None:
    """The `--packing_factor` flag's value for `config` (None: the task's own)."""
    if not spec:
        return None
    if not config.data.packed:
        return 1.0
    if spec in PACKINGS:
        return _named_packing(config, spec).metrics().packing_factor
    try:
        return float(spec)
    except ValueError:
        raise ValueError(
            f"--packing_factor={spec!r}: give a number >= 1, one of {sorted(PACKINGS)} or nothing."
        ) from None


def attention_needed_fraction(config: ml_collections.ConfigDict, spec: str) -> float:
    """The share of dense attention's scores the sequences of a `PACKINGS[spec]` row need: the
    sum of li^2 over L^2, averaged over the config's rows of that packing (the rest are masked)."""
    rows = _named_packing(config, spec).strategies
    need = sum(count * sum(n * n for n in lengths) for lengths, count in rows)
    return need / (sum(count for _, count in rows) * config.data.max_seq_length**2)


# The blocks the expected fraction is counted in: packed_tpu's (128 x 128). packed_gpu's smaller
# ones (128 x 64 forward, 64 x 64 backward) skip a little more: it is charged a little too much.
FRACTION_BLOCK = 128
SKIPPING_ATTENTION = ("packed_tpu", "packed_gpu")  # the attention_impls charged by the fraction


def attention_visited_fraction(
    config: ml_collections.ConfigDict, spec: str, window: int | None = None
) -> float:
    """The share of dense attention's block pairs a block-skipping kernel visits in the rows the
    `--packing_factor` flag's `spec` stands for (`block_ranges.expected_visited_fraction`), with
    a sliding `window` (None: global): a `PACKINGS` name, the config's packing of that histogram
    (padded: a sequence a row); else the task's synthetic packed rows
    (`synthetic.random_row_lengths`), and for padded rows of unknown lengths a row one sequence
    fills (1 without a window); 1 for rows no skipping kernel takes (not a multiple of its
    block). Sequences lie in a row in the packing's order, shortest first."""
    length = config.data.max_seq_length
    if length % FRACTION_BLOCK:
        return 1.0
    if spec in PACKINGS:
        rows = _named_packing(config, spec).strategies
    elif config.data.packed:
        depth = config.data.max_sequences_per_pack
        rows = [(r, 1) for r in synthetic.random_row_lengths(256, length, depth, config.seed)]
    else:
        rows = [([length], 1)]
    return block_ranges.expected_visited_fraction(
        rows, length, FRACTION_BLOCK, FRACTION_BLOCK, window
    )


def format_report(r: Report, largest: int | None = None, top_classes: int = 6) -> str:
    """The report as a person reads it (every time a roofline prediction), with the costliest
    ops of its `top_classes` costliest classes."""
    m = r.model
    t, e = r.train_memory, r.eval_memory
    over = max(t.total, e.total if e else 0) - r.hbm_bytes
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
    if m["attention"] in SKIPPING_ATTENTION:
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
