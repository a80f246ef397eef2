r"""The table a researcher reads before booking TPUs: BERT-base and BERT-large, packed and padded,
compiled for TPU slices on this (CPU) host. Every time and rate in it is a roofline prediction.

    python benchmarks/compile_table.py             # writes benchmarks/results/compile_table.json
    python benchmarks/compile_table.py --markdown  # the table docs/compile.md shows
    python benchmarks/compile_table.py --check_largest  # the whole model at one cell's largest
                                                        # batch and one row a device more

A full BERT-large step takes minutes to compile on 2 cores, so each cell compiles the real step
(`bert_flax.aot.compile_steps`: the config's rules, optimizer, attention, row shapes) at 1 and 2
layers, at the recipe's rows and twice as many, and every figure (HBM per device, FLOPs,
collective bytes, roofline seconds) is fitted exactly as a + b L + c R + d L R over layers L and
rows R, then read at the model's depth (a transformer's layers are identical, so each figure is
affine in L, and affine in R at a fixed L). Compiling at the rows read keeps XLA's tiling and
buffer choices those of the real step (2 to 4 rows a device, below a TPU tile, doubled the HBM
read at 16). `--check` compiles BERT-base at full depth at the rows of the v5e-8 512 packed cell
and adds the fit's error there to the JSON. Rows: the recipe's 256 sequences a step (packed:
256 / p rows, p from `packing.synthetic.corpus_like_histogram`, the figures of a real Wikipedia
histogram), or the most that fit, whichever is fewer; one micro-batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np

from bert_flax import aot, sharding, targets, train_setup
from configs import bert_base, bert_large

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compile_table.json")
MODELS = {"base": bert_base, "large": bert_large}
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
]
FITTED = ("memory", "xla_flops", "collective_bytes", "compute_s", "collective_s")
ROW_MULTIPLES = (1, 2)  # of the recipe's rows
LAYERS = (1, 2)
# Stored with the results; a rerun keeps only cells of this method. Change it when what a cell
# compiles or how it is fitted changes (the docstring's paragraph on the method).
METHOD = "layers (1, 2) x rows (1, 2) x recipe's, fitted a + bL + cR + dLR: version 1"


def cell_config(model: str, length: int, packed: bool, layers: int, rows: int):
    config = MODELS[model].get_config("phase1" if length == 128 else "phase2")
    config.data.synthetic = True
    config.data.packed = packed
    config.model.num_layers = layers
    config.train.packing_hparams, config.train.accumulation = "none", 1
    config.train.batch_size = config.eval.batch_size = rows
    return config


def figures(report: aot.Report) -> dict[str, float]:
    compute = sum(c.seconds for c in report.classes.values())
    return {
        "memory": report.train_memory.total,
        "xla_flops": report.xla_flops,
        "collective_bytes": report.collective_bytes,
        "compute_s": compute,
        "collective_s": report.collective_bytes / report.link_bytes_per_s,
    }


def fit(points: dict[tuple[int, int], dict[str, float]]) -> dict[str, np.ndarray]:
    """Per figure, (a, b, c, d) of a + b L + c R + d L R through the four (L, R) points."""
    keys = sorted(points)
    design = np.array([[1, layers, rows, layers * rows] for layers, rows in keys], float)
    return {
        name: np.linalg.solve(design, np.array([points[k][name] for k in keys], float))
        for name in FITTED
    }


def at(coefficients: dict[str, np.ndarray], layers: int, rows: float) -> dict[str, float]:
    return {k: float(c @ [1, layers, rows, layers * rows]) for k, c in coefficients.items()}


@dataclasses.dataclass
class Cell:
    model: str
    length: int
    target: str
    packed: bool
    packing_factor: float
    layers: int
    parameters: int
    recipe_rows: int
    largest_rows: int
    rows: int
    fits_recipe: bool
    figures: dict[str, float]
    model_flops_per_step: float
    compile_s: float

    @property
    def step_s(self) -> float:
        return self.figures["compute_s"] + self.figures["collective_s"]

    @property
    def sequences_per_s(self) -> float:
        return self.rows * self.packing_factor / self.step_s


def measure_cell(model: str, length: int, target_name: str, packed: bool) -> Cell:
    target = targets.target(target_name)
    devices = targets.compile_only_devices(target)
    started = time.perf_counter()
    points = {}
    factor = aot.packing_factor(cell_config(model, length, packed, 1, 8), "corpus_like")
    shards = len(devices)
    recipe = shards * math.ceil(RECIPE_SEQUENCES / factor / shards)
    for layers in LAYERS:
        for multiple in ROW_MULTIPLES:
            rows = multiple * recipe
            config = cell_config(model, length, packed, layers, rows)
            steps = aot.compile_steps(config, devices, factor, evaluate=False)
            report = aot.report(steps, target)
            points[layers, rows] = figures(report)
            print(f"  {model} {length} {target_name} packed={packed} L={layers} rows={rows}: "
                  f"{steps.seconds['train']:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    coefficients = fit(points)
    full = cell_config(model, length, packed, MODELS[model].get_config().model.num_layers, 8)
    mesh = sharding.create_mesh(full.mesh.shape, full.mesh.axes, devices)
    program = train_setup.create_train_program(full, mesh, packing_factor_override=factor)
    depth, params = program.model_config.num_layers, program.abstract_state.params
    # Memory at the full depth: fixed + per_row x rows; the most rows that fit, per data shard.
    fixed, per_row = (coefficients["memory"] @ v for v in ([1, depth, 0, 0], [0, 0, 1, depth]))
    largest = max(0, math.floor((target.chip.hbm_bytes - fixed) / per_row / shards) * shards)
    rows = min(recipe, largest)
    flops = aot.model_flops_per_step(params, program.model_config, rows, program.task.row_shape)
    return Cell(
        model, length, target_name, packed, factor, depth, aot.parameter_count(params), recipe,
        largest, rows,
        recipe <= largest, at(coefficients, depth, rows), flops,
        time.perf_counter() - started,
    )  # fmt: skip


def check(cells: list[dict], model="base", length=512, target_name="v5e-8") -> dict:
    """The fitted figures of one packed cell against a compile of the whole model at its rows."""
    (cell,) = [
        c for c in cells
        if (c["model"], c["length"], c["target"], c["packed"]) == (model, length, target_name, True)
    ]  # fmt: skip
    target = targets.target(target_name)
    config = cell_config(model, length, True, None, cell["rows"])
    devices = targets.compile_only_devices(target)
    steps = aot.compile_steps(config, devices, cell["packing_factor"], evaluate=False)
    compiled = figures(aot.report(steps, target))
    return {
        "cell": [model, length, target_name, "packed", cell["rows"]],
        "compile_s": steps.seconds["train"],
        "compiled": compiled,
    }


def check_largest(cells: list[dict], model="base", length=512, target_name="v5e-8") -> dict:
    """The whole model of one packed cell compiled at its fitted largest batch and at one row a
    data shard more: the first should fit the chip's HBM and the second not."""
    (cell,) = [
        c for c in cells
        if (c["model"], c["length"], c["target"], c["packed"]) == (model, length, target_name, True)
    ]  # fmt: skip
    target = targets.target(target_name)
    devices = targets.compile_only_devices(target)
    compiled = {}
    for rows in (cell["largest_rows"], cell["largest_rows"] + len(devices)):
        config = cell_config(model, length, True, None, rows)
        steps = aot.compile_steps(config, devices, cell["packing_factor"], evaluate=False)
        memory = aot.report(steps, target).train_memory.total
        compiled[str(rows)] = {"memory": memory, "fits": memory <= target.chip.hbm_bytes}
    return {"cell": [model, length, target_name, "packed"], "compiled": compiled}


def largest_line(check: dict) -> str:
    """`check_largest`'s compiles, as docs/compile.md shows them."""
    model, length, target, _ = check["cell"]
    (first, above), (second, below) = check["compiled"].items()
    said = lambda rows, c: (
        f"{rows} rows {c['memory'] / 2**30:.2f} GiB ({'fits' if c['fits'] else 'does not fit'})"
    )
    verdict = {
        (True, False): "as the fit says",
        (True, True): "both fit, so the fitted largest batch is conservative here",
        (False, False): "neither fits, so the fitted largest batch is too large here",
    }.get((above["fits"], below["fits"]), "the larger fits and the smaller does not")
    return (
        f"Largest batch, BERT-{model} packed at {length} on {target}, the whole model compiled "
        f"at the fitted largest batch and one row a device more: {said(first, above)}, "
        f"{said(second, below)}: {verdict}."
    )


def fit_error(check: dict, cells: list[dict]) -> dict[str, float]:
    """The fitted figures of the checked cell over the whole-model compile's, minus one."""
    model, length, target, _, rows = check["cell"]
    for cell in cells:
        if (cell["model"], cell["length"], cell["target"], cell["packed"], cell["rows"]) == (
            model, length, target, True, rows
        ):  # fmt: skip
            compiled = check["compiled"]
            return {k: cell["figures"][k] / compiled[k] - 1 for k in FITTED if compiled[k]}
    return {}  # that cell is not compiled yet


def markdown(cells: list[dict]) -> str:
    """The table as docs/compile.md shows it (from the JSON, so the docs cannot drift)."""
    head = (
        "| model | length | slice | rows | fits 256 seq. | largest batch (rows) | HBM / device "
        "(GiB) | TFLOPs / step | collectives (MiB / device) | step (ms) | sequences / s | "
        "MFU |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for c in cells:
        f = c["figures"]
        if not c["rows"]:  # the fit's memory per row was not positive: no batch to read at
            lines.append(f"| BERT-{c['model']} {'packed' if c['packed'] else 'padded'} | "
                         f"{c['length']} | {c['target']} |" + " fit failed |" * 9)  # fmt: skip
            continue
        layout = f"packed ({c['packing_factor']:.2f})" if c["packed"] else "padded"
        devices = targets.target(c["target"]).chips
        peak = targets.target(c["target"]).chip.peak_flops * devices
        mfu = c["model_flops_per_step"] / (c["step_s"] * peak) if c["rows"] else 0.0
        lines.append(
            f"| BERT-{c['model']} {layout} | {c['length']} | {c['target']} | {c['rows']} | "
            f"{'yes' if c['fits_recipe'] else 'no'} | {c['largest_rows']} | "
            f"{f['memory'] / 2**30:.1f} | {f['xla_flops'] * devices / 1e12:.1f} | "
            f"{f['collective_bytes'] / 2**20:.0f} | {c['step_s'] * 1e3:.0f} | "
            f"{c['sequences_per_s']:,.0f} | {mfu:.0%} |"
        )
    return "\n".join(lines)


def check_lines(check: dict, cells: list[dict]) -> str:
    """The `--check` compile against the fit, as docs/compile.md shows it."""
    model, length, target, _, rows = check["cell"]
    errors = ", ".join(f"{k} {v:+.0%}" for k, v in fit_error(check, cells).items())
    errors = errors or "not known yet (that cell is not compiled yet)"
    c = check["compiled"]
    step = c["compute_s"] + c["collective_s"]
    return (
        f"Check, BERT-{model} packed at {length} on {target}, {rows} rows, the whole model "
        f"compiled ({check['compile_s']:.0f} s): HBM {c['memory'] / 2**30:.2f} GiB per device, "
        f"{c['xla_flops'] * targets.target(target).chips / 1e12:.1f} TFLOPs a step, "
        f"collectives {c['collective_bytes'] / 2**20:.0f} MiB, step {step * 1e3:.0f} ms "
        f"(prediction). The fit's error there: {errors}."
    )


def load(path: str) -> dict:
    """The results so far: cells compiled by this method are kept (a rerun resumes), others
    dropped; the whole-model check does not depend on the method."""
    if not os.path.exists(path):
        return {"method": METHOD, "cells": []}
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    if results["method"] == METHOD:
        return results
    return {"method": METHOD, "cells": [], **{k: v for k, v in results.items() if k == "check"}}


def save(results: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


def missing_cells(cells: list[dict]) -> list[tuple[str, int, str, bool]]:
    done = {(c["model"], c["length"], c["target"], c["packed"]) for c in cells}
    return [(*cell, packed) for cell in CELLS for packed in (True, False)
            if (*cell, packed) not in done]  # fmt: skip


def rendered(results: dict) -> str:
    """The table, the cells not compiled yet and the check, as docs/compile.md shows them."""
    parts = [markdown(results["cells"])]
    todo = missing_cells(results["cells"])
    if todo:
        names = [f"BERT-{m} {'packed' if p else 'padded'} {n} on {t}" for m, n, t, p in todo]
        parts.append("Not compiled yet: " + ", ".join(names))
    if "check" in results:
        parts.append(check_lines(results["check"], results["cells"]))
    if "largest_check" in results:
        parts.append(largest_line(results["largest_check"]))
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="Print the table from the JSON.")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--check", action="store_true", help="Check the fit (see above).")
    parser.add_argument(
        "--check_largest", action="store_true", help="Check one cell's largest batch (see above)."
    )
    args = parser.parse_args()
    results = load(args.out)
    if args.markdown:
        print(rendered(results))
        return
    if args.check:
        results["check"] = check(results["cells"])
        print(json.dumps(results["check"], indent=1))
        save(results, args.out)
        return
    if args.check_largest:
        results["largest_check"] = check_largest(results["cells"])
        print(largest_line(results["largest_check"]))
        save(results, args.out)
        return
    for model, length, target, packed in missing_cells(results["cells"]):
        cell = measure_cell(model, length, target, packed)
        results["cells"].append(dataclasses.asdict(cell) | {
            "step_s": cell.step_s, "sequences_per_s": cell.sequences_per_s})  # fmt: skip
        save(results, args.out)
    print(markdown(results["cells"]))


if __name__ == "__main__":
    main()
