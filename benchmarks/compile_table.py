r"""The table a researcher reads before booking TPUs: BERT-base and BERT-large, packed and padded,
compiled for TPU slices (and single GPUs) on this CPU host. Every time and rate in it is a
roofline prediction.

    python -m benchmarks.compile_table             # writes benchmarks/results/compile_table.json
    python -m benchmarks.compile_table --markdown  # the table docs/compile.md shows
    python -m benchmarks.compile_table --targets h100 h200   # the GPU rows alone
    python -m benchmarks.compile_table --optimizers    # only the optimizer rows (below)
    python -m benchmarks.compile_table --long_context  # only the long-context rows (below)

Each cell compiles the real train step of the config (`bert_flax.aot.program.compile_steps`:
its rules, optimizer, attention, remat policy, scanned layers) at the model's full depth, once, at
the recipe's rows: BERT's 256 sequences a step (packed: 256 / p rows, p from
`packing.synthetic.corpus_like_histogram`, the figures of a real Wikipedia histogram), one
micro-batch; a block-skipping attention kernel (packed_tpu, packed_gpu) is charged the share of
block pairs it visits in that packing's rows (`packings.attention_visited_fraction`).
Two readings of that compile, both linear in the rows:
- the largest batch: the train state's bytes are fixed, the temporaries grow with the rows, so
  the most rows a data shard takes is where fixed + temporaries per row x rows meets the chip's
  HBM; a cell whose recipe does not fit is compiled again at that batch;
- the best batch: the optimizer's update and the collectives cost the same at any batch, every
  other class grows with the rows, so the predicted sequences a second rise with the batch up to
  the largest one, and the table gives that rate.
`REMAT_CELLS` are compiled at every remat policy too (largest batch and rate at each). A rerun
resumes: cells of this `METHOD` already in the JSON are kept; the figures of a previous method
stay beside the new ones as "before".

The optimizer rows (`OPTIMIZER_CELLS`, docs/optim.md) compile the base recipes that differ only in
the optimizer (configs/bert_base_lamb.py, configs/bert_base_shampoo.py, configs/bert_base_soap.py;
AdamW: configs/bert_base.py's optimizer on the LAMB recipe) at their own micro-batch, and plain SGD
(no momentum) there as the reference. An optimizer's update is its micro-step's excess over the
reference's (its ops are not all of the `optimizer` class: moving and reshaping its state too); the
recipe's step is the reference's micro-step once per micro-batch, less the collectives, which run
once, plus the update.
Shampoo's roots and SOAP's eigenbases are not in the step (asynchronous: a host thread computes
them every N steps); their cost is *measured* on this host (`host_refresh`), a sample of the
statistics' blocks solved as the host thread solves them and scaled to all of them, and given
per refresh and amortised per step: a CPU figure of this machine, not a TPU host's.

The long-context rows (`LONG_CELLS`) are cells as above of BERT-base at 1,024-8,192 tokens a row
(configs/bert_base_long.py), packed and padded, each with the platform's flash kernel that visits
every block (`DENSE_KERNELS`: splash on TPU, pallas_gpu on GPU, "auto"'s before the block-skipping
ones) and with the block-skipping kernel (`SKIPPING_KERNELS`, "auto"'s now). Their rows
come from the web-like long-context histogram (`packings.PACKINGS["web_like"]`, the `lognormal_web`
files of packing/data/) packed by the config's packer, which gives the packing factor, the share of
block pairs the skipping kernel visits and the share of scores the sequences need (the sum of li^2
over L^2, `packings.attention_needed_fraction`). `long_table` reads packed over padded sequences a
second against the factor, attention's share of the step, and the skipping kernel's attention time
against what that need costs at today's kernel's rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable

import jax
import numpy as np

from benchmarks.lib.records import Read, commit, now
from bert_flax.aot import packings, program, roofline, targets
from bert_flax.model import config as config_lib
from configs import (
    bert_base,
    bert_base_lamb,
    bert_base_long,
    bert_base_shampoo,
    bert_base_soap,
    bert_large,
)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compile_table.json")
MODELS = {"base": bert_base, "large": bert_large}
LONG_MODELS = {"base": bert_base_long}  # past 512 tokens a row
RECIPE_SEQUENCES = 256  # BERT's sequences a step (Devlin et al., 2019)
# (model, length, target) cells; every one packed and padded.
CELLS = [
    ("base", 512, "v5e-8"),
    ("large", 512, "v5e-8"),
    ("base", 128, "v5e-8"),
    ("base", 512, "v5p-8"),
    ("large", 512, "v5p-8"),
    ("base", 512, "v6e-8"),
    ("large", 512, "v6e-8"),
    ("base", 512, "h100"),
    ("base", 512, "h200"),
]
# (model, length, target, packed) cells also compiled at every remat policy.
REMAT_CELLS = [("base", 512, "v5e-8", True), ("large", 512, "v5e-8", True)]
# (model, length, target, packed) cells whose step the docs break down by op class.
BREAKDOWN_CELLS = [("base", 512, "v5e-8", True), ("base", 512, "v6e-8", True),
                   ("base", 512, "h100", True), ("base", 512, "h200", True),
                   ("large", 512, "v5e-8", True)]  # fmt: skip
# Classes whose cost does not grow with the batch (`hlo.classify`): the update of the state.
PER_STEP_CLASSES = ("optimizer",)
# Optimizer rows: BERT-base packed at 128 (the race's phase 1) on a v5e-8, one per optimizer.
REFERENCE_OPTIMIZER = "sgd"  # no momentum: the update costs next to nothing
OPTIMIZER_CELLS = ("base", 128, "v5e-8", (REFERENCE_OPTIMIZER, "lamb", "adamw", "shampoo", "soap"))
OPTIMIZER_CONFIGS = {"lamb": bert_base_lamb, "shampoo": bert_base_shampoo, "soap": bert_base_soap}
# Statistics' blocks solved per (size, exponent) group to time the host's refresh.
HOST_SAMPLE = 64
# Long-context rows: (model, length, target, packed, attention_impl), every one packed and padded,
# with the platform's flash kernel that visits every block and with the one that skips blocks
# ("auto"'s), per `targets.Target.platform`.
LONG_PACKING = "web_like"  # `packings.PACKINGS`: the long-context histogram of the rows
DENSE_KERNELS = {"tpu": "splash", "cuda": "pallas_gpu"}
SKIPPING_KERNELS = {"tpu": "packed_tpu", "cuda": "packed_gpu"}
LONG_CELLS = [
    ("base", length, target, packed, kernels[targets.target(target).platform])
    for length in (1024, 2048, 8192)
    for target in ("v5e-8", "v6e-8", "h100")
    for packed in (True, False)
    for kernels in (DENSE_KERNELS, SKIPPING_KERNELS)
]
# The classes of attention's own work (`hlo.classify`): scores, context, a fused kernel.
ATTENTION_CLASSES = ("attention_scores", "attention_context", "attention_fused")
# Stored with the results; a rerun keeps only cells of this method. Change it when what a cell
# compiles or how it is read changes (the docstring).
METHOD = "whole model, one compile at the recipe's rows, linear in the rows: version 3"


def cell_config(model: str, length: int, packed: bool, rows: int, target: targets.Target,
                remat: str | None = None, attention: str | None = None):  # fmt: skip
    """The config's own step at `rows` a step, one micro-batch, on synthetic data (past 512
    tokens: configs/bert_base_long.py's); `attention` replaces its attention_impl."""
    if length > 512:
        config = LONG_MODELS[model].get_config(str(length))
    else:
        config = MODELS[model].get_config("phase1" if length == 128 else "phase2")
    config.data.synthetic = True
    config.data.packed = packed
    config.train.packing_hparams, config.train.accumulation = "none", 1
    config.train.batch_size = config.eval.batch_size = rows
    if remat is not None:
        config.model.remat_policy = remat
    if attention is not None:
        config.model.attention_impl = attention
    return config


@dataclasses.dataclass
class Compiled:
    """What one compile of a cell says, per device."""

    rows: int
    memory: float  # HBM of the train step
    state_memory: float  # what does not grow with the rows: all but the temporaries
    flops: float  # XLA's count (the profiler's where XLA gives none: CUDA)
    collective_bytes: float
    classes: dict[str, float]  # roofline seconds per op class
    collective_s: float
    model_flops: float  # per step, all devices (`roofline.model_flops_per_step`)
    model: dict  # layers, parameters, attention, ... (`roofline.Report.model`)
    compile_s: float
    attention_visited_fraction: float = 1.0  # `roofline.Report`'s: the skipping kernels' charge
    attention_needed_fraction: float = 1.0  # `roofline.Report`'s: the attention model_flops counts

    @property
    def step_s(self) -> float:
        return sum(self.classes.values()) + self.collective_s

    def largest_rows(self, hbm_bytes: float, shards: int) -> int:
        per_row = (self.memory - self.state_memory) / self.rows
        return max(0, math.floor((hbm_bytes - self.state_memory) / per_row / shards) * shards)

    def step_s_at(self, rows: int) -> float:
        """The step at `rows`: per-step classes and collectives fixed, the rest per row."""
        fixed = sum(self.classes.get(c, 0.0) for c in PER_STEP_CLASSES) + self.collective_s
        return fixed + (self.step_s - fixed) * rows / self.rows


def compile_cell(
    config, target: targets.Target, devices, factor: float, **fractions: float
) -> Compiled:
    """One compile of `config` with the attention `fractions` (`program.compile_steps`'s); where
    XLA refuses it for the chip's HBM, again at half the rows (down to one a device), since the
    figures are read linearly in the rows anyway."""
    shards = len(devices)
    try:
        steps = program.compile_steps(config, devices, factor, evaluate=False, **fractions)
    except jax.errors.JaxRuntimeError as e:
        rows = config.train.batch_size
        if "RESOURCE_EXHAUSTED" not in str(e) or rows <= shards:
            raise
        config.train.batch_size = config.eval.batch_size = shards * (rows // shards // 2)
        return compile_cell(config, target, devices, factor, **fractions)
    report = roofline.report(steps, target)
    memory = report.train_memory
    return Compiled(
        rows=report.rows_per_step,
        memory=memory.total,
        state_memory=memory.total - memory.temporaries,
        flops=report.xla_flops or report.hlo_flops,
        collective_bytes=report.collective_bytes,
        classes={name: c.seconds for name, c in report.classes.items()},
        collective_s=report.collective_bytes / report.link_bytes_per_s,
        model_flops=report.model_flops_per_step,
        model=report.model,
        compile_s=steps.seconds["train"],
        attention_visited_fraction=report.attention_visited_fraction,
        attention_needed_fraction=report.attention_needed_fraction,
    )


@dataclasses.dataclass
class Cell:
    model: str
    length: int
    target: str
    packed: bool
    packing_factor: float
    remat: str
    recipe_rows: int
    largest_rows: int
    compiled: Compiled  # at min(recipe rows, largest rows)
    remat_policies: dict[str, dict[str, float]]  # REMAT_CELLS: per policy, largest and rate

    @property
    def rows(self) -> int:
        return self.compiled.rows

    @property
    def sequences_per_s(self) -> float:
        return self.rows * self.packing_factor / self.compiled.step_s

    @property
    def best_sequences_per_s(self) -> float:
        rows = self.largest_rows
        return rows * self.packing_factor / self.compiled.step_s_at(rows) if rows else 0.0

    def mfu(self, rows: int, step_s: float) -> float:
        slice_ = targets.target(self.target)
        flops = self.compiled.model_flops / self.rows * rows
        return flops / (step_s * slice_.chip.peak_flops * slice_.chips)

    def as_dict(self) -> dict:
        derived = {
            "rows": self.rows,
            "step_s": self.compiled.step_s,
            "sequences_per_s": self.sequences_per_s,
            "mfu": self.mfu(self.rows, self.compiled.step_s),
            "best_sequences_per_s": self.best_sequences_per_s,
            "predicted": ["step_s", "sequences_per_s", "mfu", "best_sequences_per_s"],
        }
        return dataclasses.asdict(self) | derived


def packing_spec(length: int) -> str:
    """The `packings.PACKINGS` name a cell's rows are packed from."""
    return LONG_PACKING if length > 512 else "corpus_like"


def measure_cell(
    model: str, length: int, target_name: str, packed: bool, attention: str | None = None
) -> Cell:
    target = targets.target(target_name)
    devices = targets.compile_only_devices(target)
    shards = len(devices)
    build = lambda rows, remat=None: cell_config(
        model, length, packed, rows, target, remat, attention
    )
    spec = packing_spec(length)
    factor = packings.packing_factor(build(shards), spec)
    fractions = {
        "attention_visited_fraction": packings.attention_visited_fraction(build(shards), spec),
        "attention_needed_fraction": packings.attention_needed_fraction(build(shards), spec),
    }
    recipe = shards * math.ceil(RECIPE_SEQUENCES / factor / shards)
    compiled = compile_cell(build(recipe), target, devices, factor, **fractions)
    largest = compiled.largest_rows(target.chip.hbm_bytes, shards)
    if 0 < largest < recipe and largest != compiled.rows:  # the figures at the largest batch
        compiled = compile_cell(build(largest), target, devices, factor, **fractions)
    remat = build(recipe).model.remat_policy
    policies = {}
    if (model, length, target_name, packed) in REMAT_CELLS:
        for policy in config_lib.REMAT_POLICIES:
            config = build(recipe, policy)
            reuse = policy == remat and compiled.rows == recipe
            at = compiled if reuse else compile_cell(config, target, devices, factor, **fractions)
            rows = at.largest_rows(target.chip.hbm_bytes, shards)
            policies[policy] = {
                "largest_rows": rows,
                "rows": at.rows,
                "step_s": at.step_s,
                "best_sequences_per_s": rows * factor / at.step_s_at(rows) if rows else 0.0,
            }
    print(f"  {model} {length} {target_name} packed={packed} {attention or ''}: "
          f"{compiled.compile_s:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    return Cell(model, length, target_name, packed, factor, remat, recipe, largest, compiled,
                policies)  # fmt: skip


def measure_long_cell(model: str, length: int, target_name: str, packed: bool,
                      attention: str) -> dict:  # fmt: skip
    """A `LONG_CELLS` row: the cell with `attention`, and the share of dense attention's scores
    its rows' sequences need."""
    cell = measure_cell(model, length, target_name, packed, attention).as_dict()
    needed = cell["compiled"]["attention_needed_fraction"]
    return cell | {"attention_impl": attention, "attention_needed_fraction": needed}


def optimizer_config(optimizer: str, length: int):
    """The base LAMB recipe's phase with `optimizer`'s block (AdamW: configs/bert_base.py's;
    the reference: SGD without momentum)."""
    phase = "phase1" if length == 128 else "phase2"
    if optimizer in OPTIMIZER_CONFIGS:
        return OPTIMIZER_CONFIGS[optimizer].get_config(phase)
    config = bert_base_lamb.get_config(phase)
    if optimizer == REFERENCE_OPTIMIZER:
        config.optimizer.name, config.optimizer.sgd.momentum = "sgd", 0.0
        config.train.packing_hparams = "none"  # SGD has no betas to raise; the rows are the same
        return config
    adamw = bert_base.get_config(phase)
    config.optimizer, config.schedule.learning_rate = adamw.optimizer, adamw.schedule.learning_rate
    return config


def host_refresh(compiled_program, sample: int = HOST_SAMPLE) -> dict | None:
    """Shampoo's roots or SOAP's eigenbases of one refresh, timed on this host's CPU: per (block
    size, exponent) group, `sample` statistics (G G^T of Gaussian G, ridged as the solver does)
    solved by the host thread's function, the time scaled to the group's blocks. None for an
    optimizer without host work."""
    host = getattr(compiled_program.tx, "host", None)
    if host is None:
        return None
    state = host.find_state(compiled_program.abstract_state.opt_state)
    stats, _, exponents = host.factors(state.tensors)
    exponents = exponents or (None,) * len(stats)  # (SOAP's eigenbases have none)
    groups: dict[tuple[int, int | None], int] = {}
    for stat, p in zip(stats, exponents):
        groups[stat.shape[-1], p] = groups.get((stat.shape[-1], p), 0) + stat.shape[0]
    rng, seconds = np.random.default_rng(0), 0.0
    for (size, p), blocks in groups.items():
        n = min(sample, blocks)
        g = rng.standard_normal((n, size, 4 * size)).astype(np.float32)
        stat = np.einsum("nab,ncb->nac", g, g) / (4 * size)
        seconds += _solve_seconds(stat, p, host) * blocks / n
    every = host.config.preconditioning_compute_steps
    return {
        "blocks": sum(groups.values()),
        "statistics_bytes": sum(s.size * s.dtype.itemsize for s in stats),
        "every_steps": every,
        "seconds_per_refresh": seconds,
        "seconds_per_step": seconds / every,
        "measured_on": f"{os.cpu_count()} CPU cores",
    }


def _solve_seconds(stat: np.ndarray, p: int | None, host) -> float:
    """Seconds of the host thread's solve of the blocks `stat` (once compiled) on this CPU."""
    identity = np.broadcast_to(np.eye(stat.shape[-1], dtype=np.float32), stat.shape)
    args = jax.device_put(([stat], [identity]), jax.devices("cpu")[0])
    exponents = () if p is None else (p,)
    jax.block_until_ready(host.solve(*args, exponents))
    start = time.perf_counter()
    jax.block_until_ready(host.solve(*args, exponents))
    return time.perf_counter() - start


def measure_optimizer_cell(model: str, length: int, target_name: str, optimizer: str) -> dict:
    """One optimizer row: its micro-batch compiled, the recipe's step predicted, the host's
    refresh measured (module doc)."""
    target = targets.target(target_name)
    devices = targets.compile_only_devices(target)
    config = optimizer_config(optimizer, length)
    batch, accumulation = config.train.batch_size, config.train.accumulation
    micro = batch // accumulation
    config.data.synthetic = True
    config.train.accumulation, config.train.batch_size = 1, micro
    config.eval.batch_size = micro
    factor = packings.packing_factor(config, "corpus_like")
    steps = program.compile_steps(config, devices, factor, evaluate=False)
    report = roofline.report(steps, target)
    classes = {name: c.seconds for name, c in report.classes.items()}
    compiled = Compiled(
        rows=report.rows_per_step, memory=report.train_memory.total,
        state_memory=report.train_memory.total - report.train_memory.temporaries,
        flops=report.xla_flops or report.hlo_flops, collective_bytes=report.collective_bytes,
        classes=classes, collective_s=report.collective_bytes / report.link_bytes_per_s,
        model_flops=report.model_flops_per_step, model=report.model,
        compile_s=steps.seconds["train"],
    )  # fmt: skip
    host = host_refresh(steps.program)
    print(f"  {model} {length} {target_name} {optimizer}: {compiled.compile_s:.0f} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return {
        "model": model, "length": length, "target": target_name, "optimizer": optimizer,
        "packing_factor": factor, "batch_rows": batch, "accumulation": accumulation,
        "compiled": dataclasses.asdict(compiled),
        "micro_step_s": compiled.step_s,
        "host": host,
    }  # fmt: skip


def with_predictions(cells: list[dict]) -> list[dict]:
    """`cells` with each optimizer's update and the recipe's step predicted against the
    reference's micro-step (module doc); unchanged until the reference is compiled."""
    reference = {c["optimizer"]: c for c in cells}.get(REFERENCE_OPTIMIZER)
    if reference is None:
        return cells
    model_s = reference["micro_step_s"] - reference["compiled"]["collective_s"]
    out = []
    for c in cells:
        update = c["micro_step_s"] - reference["micro_step_s"]
        step = c["accumulation"] * model_s + c["compiled"]["collective_s"] + update
        predicted = {"update_s": update, "step_s": step}
        out.append(c | predicted | {"predicted": ["micro_step_s", *predicted]})
    return out


def optimizer_table(cells: list[dict]) -> str:
    """The optimizer rows: each optimizer's predicted step and its host's refresh."""
    lines = [
        "| optimizer | slice | rows a step (micro-batches) | HBM kept across steps / device (GiB) "
        "| update (ms) | step (ms) | host refresh (s), every N steps | host s / step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        if "step_s" not in c:
            continue
        host = c["host"]
        refresh = (
            "-" if host is None else f"{host['seconds_per_refresh']:.1f}, {host['every_steps']}"
        )
        amortised = "-" if host is None else f"{host['seconds_per_step']:.3f}"
        name = c["optimizer"] + (" (reference)" if c["optimizer"] == REFERENCE_OPTIMIZER else "")
        lines.append(
            f"| {name} | "
            f"BERT-{c['model']} packed {c['length']} {c['target']} | "
            f"{c['batch_rows']:,} ({c['accumulation']}) | "
            f"{c['compiled']['state_memory'] / 2**30:.2f} | {c['update_s'] * 1e3:.2f} | "
            f"{c['step_s'] * 1e3:,.0f} | {refresh} | {amortised} |"
        )
    measured = {c["host"]["measured_on"] for c in cells if c["host"]}
    if measured:
        lines.append(
            f"\nPredicted: update, step. Measured: the host's refreshes, on the machine that "
            f"compiled the table ({', '.join(sorted(measured))}), not a TPU host."
        )
    return "\n".join(lines)


def _key(c: dict) -> tuple:
    return c["model"], c["length"], c["target"], c["packed"]


def _long_key(c: dict) -> tuple:
    return *_key(c), c["attention_impl"]


def attention_s_per_row(cell: dict) -> float:
    """The predicted seconds of attention's own work (`ATTENTION_CLASSES`) a row."""
    classes = cell["compiled"]["classes"]
    return sum(classes.get(name, 0.0) for name in ATTENTION_CLASSES) / cell["rows"]


def long_table(cells: list[dict]) -> str:
    """The long-context rows, packed against padded with the same attention: the gain against
    the packing factor, attention's share of the packed step, and its time a row against what the
    sequences need (the dense kernel's time a row times the sum of li^2 over L^2)."""
    by_key = {_long_key(c): c for c in cells}
    lines = [
        "| length | slice | attention | packing factor | packed / padded sequences a second | "
        "of the factor | attention's share of the packed step | attention a packed row (ms) | "
        "over the sum of li^2's need |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        model, length, target, packed, attention = _long_key(c)
        padded = by_key.get((model, length, target, False, attention))
        if not packed or padded is None:
            continue
        gain = c["sequences_per_s"] / padded["sequences_per_s"]
        share = attention_s_per_row(c) * c["rows"] / c["step_s"]
        dense = DENSE_KERNELS[targets.target(target).platform]
        today = by_key.get((model, length, target, True, dense))
        over = "-"
        if today is not None:
            need = attention_s_per_row(today) * c["attention_needed_fraction"]
            over = f"{attention_s_per_row(c) / need:.2f}"
        lines.append(
            f"| {length:,} | {target} | {c['compiled']['model']['attention']} | "
            f"{c['packing_factor']:.2f} | {gain:.2f} | {gain / c['packing_factor']:.2f} | "
            f"{share:.0%} | {attention_s_per_row(c) * 1e3:.3f} | {over} |"
        )
    return "\n".join(lines)


def markdown(cells: list[dict], previous: list[dict]) -> str:
    """The table as docs/compile.md shows it (from the JSON, so the docs cannot drift)."""
    before = {_key(c): c for c in previous}
    lines = [
        "| model | length | slice | attention, remat | rows | fits 256 seq. | largest batch "
        "(rows) | HBM / device (GiB) | TFLOPs / step | step (ms) | sequences / s | MFU | at the "
        "largest batch: sequences / s | before: step (ms), sequences / s, MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        layout = f"packed ({c['packing_factor']:.2f})" if c["packed"] else "padded"
        chips = targets.target(c["target"]).chips
        old = before.get(_key(c))
        was = "-" if old is None else (
            f"{old['step_s'] * 1e3:.0f}, {old['sequences_per_s']:,.0f}, {old['mfu']:.0%}"
        )  # fmt: skip
        compiled = c["compiled"]
        lines.append(
            f"| BERT-{c['model']} {layout} | {c['length']} | {c['target']} | "
            f"{compiled['model']['attention']}, {c['remat']} | {c['rows']} | "
            f"{'yes' if c['rows'] == c['recipe_rows'] else 'no'} | {c['largest_rows']} | "
            f"{compiled['memory'] / 2**30:.1f} | {compiled['flops'] * chips / 1e12:.1f} | "
            f"{c['step_s'] * 1e3:.1f} | {c['sequences_per_s']:,.0f} | {c['mfu']:.0%} | "
            f"{c['best_sequences_per_s']:,.0f} | {was} |"
        )
    return "\n".join(lines)


def packing_gain(cells: list[dict]) -> str:
    """Packed over padded sequences a second per slice, against the packing factor."""
    padded = {_key(c)[:3]: c for c in cells if not c["packed"]}
    lines = [
        "| model | length | slice | packing factor | packed / padded sequences a second | "
        "of the factor | at the largest batches: of the factor |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        if c["packed"] and _key(c)[:3] in padded:
            other = padded[_key(c)[:3]]
            gain = c["sequences_per_s"] / other["sequences_per_s"]
            best = c["best_sequences_per_s"] / other["best_sequences_per_s"]
            lines.append(
                f"| BERT-{c['model']} | {c['length']} | {c['target']} | "
                f"{c['packing_factor']:.2f} | {gain:.2f} | {gain / c['packing_factor']:.2f} | "
                f"{best / c['packing_factor']:.2f} |"
            )
    return "\n".join(lines)


def remat_table(cells: list[dict]) -> str:
    """`REMAT_CELLS` at every remat policy."""
    lines = [
        "| cell | remat | largest batch (rows) | compiled at (rows) | step there (ms) | "
        "sequences / s at the largest batch |",
        "|---|---|---|---|---|---|",
    ]
    for c in cells:
        for policy, p in c["remat_policies"].items():
            lines.append(
                f"| BERT-{c['model']} packed {c['length']} {c['target']} | {policy} | "
                f"{p['largest_rows']} | {p['rows']} | {p['step_s'] * 1e3:.1f} | "
                f"{p['best_sequences_per_s']:,.0f} |"
            )
    return "\n".join(lines)


def breakdown(cells: list[dict], key: tuple[str, int, str, bool]) -> str:
    """Where the step of one cell goes, by op class (`hlo.classify`)."""
    (cell,) = [c for c in cells if _key(c) == key] or [None]
    if cell is None:
        return ""
    classes = cell["compiled"]["classes"] | {"collectives": cell["compiled"]["collective_s"]}
    step = sum(classes.values())
    rows = [f"| {name} | {s * 1e3:.2f} | {s / step:.0%} |"
            for name, s in sorted(classes.items(), key=lambda kv: -kv[1]) if s >= 5e-5]  # fmt: skip
    head = (
        f"BERT-{key[0]} packed at {key[1]} on {key[2]}, {cell['rows']} rows, predicted per "
        f"device by op class:\n\n| class | ms | share |\n|---|---|---|"
    )
    return "\n".join([head, *rows])


def load(path: str) -> dict:
    """The results so far: cells compiled by this method are kept (a rerun resumes); the cells
    of an older method become `previous`, shown beside the new ones; the optimizer rows stay
    (each names its method) until `--optimizers` compiles them by this one."""
    if not os.path.exists(path):
        return {"method": METHOD, "cells": [], "previous": {"method": None, "cells": []}}
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    if results["method"] == METHOD:
        return results
    previous = {"method": results["method"], "cells": results["cells"]}
    kept = {"optimizer_cells": results.get("optimizer_cells", [])}
    return {"method": METHOD, "cells": [], "previous": previous} | kept


def save(results: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


def every_cell() -> list[tuple[str, int, str, bool]]:
    """(model, length, target, packed) of the table's rows, in its order."""
    return [(*cell, packed) for cell in CELLS for packed in (True, False)]


def missing_cells(cells: list[dict], names=None) -> list[tuple[str, int, str, bool]]:
    done = {_key(c) for c in cells}
    return [key for key in every_cell()
            if key not in done and (names is None or key[2] in names)]  # fmt: skip


def rendered(results: dict) -> str:
    """The tables and the cells not compiled yet, as docs/compile.md shows them."""
    order = {key: i for i, key in enumerate(every_cell())}
    cells = sorted(results["cells"], key=lambda c: order.get(_key(c), len(order)))
    parts = [markdown(cells, results["previous"]["cells"]), packing_gain(cells)]
    breakdowns = [breakdown(cells, key) for key in BREAKDOWN_CELLS]
    parts += [part for part in (remat_table(cells), *breakdowns) if part]
    todo = missing_cells(cells)
    if todo:
        names = [f"BERT-{m} {'packed' if p else 'padded'} {n} on {t}" for m, n, t, p in todo]
        parts.append("Not compiled yet: " + ", ".join(names) + ".")
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="Print the tables from the JSON.")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--targets", nargs="+", help="Compile only the cells on these slices.")
    parser.add_argument("--optimizers", action="store_true", help="Only the optimizer rows.")
    parser.add_argument(
        "--long_context", action="store_true", help="Only the long-context rows (LONG_CELLS)."
    )
    args = parser.parse_args()
    results = load(args.out)
    if args.markdown:
        print(rendered(results))
        return
    if args.optimizers:
        model, length, target, optimizers = OPTIMIZER_CELLS
        # Rows of an older method are kept until this method's replace them (each says its own).
        cells = [c for c in results.get("optimizer_cells", []) if c.get("method") == METHOD]
        done = {c["optimizer"] for c in cells}
        for optimizer in optimizers:
            if optimizer not in done:
                cell = measure_optimizer_cell(model, length, target, optimizer)
                stamp = {"commit": commit(), "date": now(), "method": METHOD}
                cells = with_predictions([*cells, cell | stamp])
                results["optimizer_cells"] = cells
                save(results, args.out)
        print(optimizer_table(results["optimizer_cells"]))
        return
    if args.long_context:
        done = {_long_key(c) for c in results.setdefault("long_cells", [])}
        for key in LONG_CELLS:
            if key not in done and (args.targets is None or key[2] in args.targets):
                cell = measure_long_cell(*key) | {"commit": commit(), "date": now()}
                results["long_cells"].append(cell)
                save(results, args.out)
        print(long_table(results["long_cells"]))
        return
    for model, length, target, packed in missing_cells(results["cells"], args.targets):
        cell = measure_cell(model, length, target, packed).as_dict()
        results["cells"].append(cell | {"commit": commit(), "date": now()})
        save(results, args.out)
    print(rendered(results))


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


HEADLINE_CELL = ("base", 512, "v5e-8", True)


def compile_row(read: Read) -> tuple[str, str]:
    cells = read("compile_table")["cells"]
    listed = lambda key: list(dict.fromkeys(c[key] for c in cells))
    models = " and ".join(f"BERT-{m}" for m in listed("model"))
    layouts = " and ".join("packed" if p else "padded" for p in listed("packed"))
    by_key = {(c["model"], c["length"], c["target"], c["packed"]): c for c in cells}
    packed, padded = by_key.get(HEADLINE_CELL), by_key.get((*HEADLINE_CELL[:3], False))
    headline = ""
    if packed and padded:
        gain = packed["sequences_per_s"] / padded["sequences_per_s"] / packed["packing_factor"]
        headline = (
            f"; BERT-base packed at 512 on v5e-8: **MFU {packed['mfu']:.0%}**, "
            f"{packed['sequences_per_s']:,.0f} sequences/s, {gain:.2f} of the packing factor "
            "over padded"
        )
    return (
        "will it fit, how fast could it be (compiled for TPU and GPU on this CPU host; "
        "**predictions**: roofline, not measured)",
        f"{models}, {layouts}, on {', '.join(listed('target'))}: fits, largest batch, HBM, "
        f"FLOPs, collectives, step time, sequences/s (predictions from compiles){headline}",
    )


def compile_block(read: Read) -> str:
    from benchmarks import compile_table  # JAX and libtpu: only for this block

    return compile_table.rendered(read("compile_table"))


def compile_optimizers_block(read: Read) -> str:
    cells = read("compile_table").get("optimizer_cells")
    return optimizer_table(cells) if cells else "Not compiled yet: `--optimizers`."


def compile_long_block(read: Read) -> str:
    cells = read("compile_table").get("long_cells")
    if not cells:
        return "Not compiled yet: `--long_context`."
    order = {key: i for i, key in enumerate(LONG_CELLS)}
    cells = sorted(cells, key=lambda c: order.get(_long_key(c), len(order)))
    todo = [key for key in LONG_CELLS if key not in {_long_key(c) for c in cells}]
    missing = [f"{'packed' if p else 'padded'} {n:,} on {t} with {a}" for _, n, t, p, a in todo]
    return long_table(cells) + ("\n\nNot compiled yet: " + ", ".join(missing) + "." if todo else "")


BLOCKS: dict[str, Callable[[Read], str]] = {
    "compile_table": compile_block,
    "compile_table_optimizers": compile_optimizers_block,
    "compile_table_long": compile_long_block,
}
README_ROW = (
    compile_row,
    "`python -m benchmarks.compile_table` "
    "([compile](docs/compile.md#the-table-before-booking-tpus))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
