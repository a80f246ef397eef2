r"""What a step costs per row and per step, packed and padded: why packing's speed-up falls short
of the packing factor when a step holds few rows.

    python -m benchmarks.step_cost --data_dir=workdir/bench/time_to_accuracy/sotu_cpu --json

The CPU recipe's training-loop step (`configs/cpu_pretrain.py`, `TrainSetup.loop_step`) at
--rows rows per step, packed and padded, every setting taking turns (`timing.side_by_side`:
--rounds rounds of --steps steps, median per setting), fitted per layout by a line:
step ms = fixed + per_row x rows. The fixed part (the optimizer over every parameter, the
relative-position table, dispatch of the step's kernels) does not shrink with the rows, so
with `divide_accumulation` (the same sequences a step: p times fewer rows packed) the packed
step saves only the per-row part: speed-up = step(R padded rows) / step(R / p packed rows),
which the JSON line gives for the recipe's R from the fitted lines (`recipe_speedup`).

Missing data is prepared in --data_dir from the bundled corpus (`demo.prepare_data`). With --json
the last line is a JSON object: optimizer, packing_factor, step_ms (layout -> rows -> median
ms), fixed_ms and per_row_ms (per layout), recipe_rows (padded, packed), recipe_speedup and its
ratio to the packing factor.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, run_sources, runs, share, times
from bert_flax import demo
from bert_flax.demo import LAYOUTS
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import side_by_side
from configs import cpu_pretrain


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default="workdir/bench/step_cost/sotu_cpu")
    parser.add_argument(
        "--dupe_factor",
        type=int,
        default=cpu_pretrain.PREPARE["dupe_factor"],
        help="Maskings of the corpus when preparing --data_dir (the step's shapes do not depend "
        "on it; prepared data of another value is an error).",
    )
    parser.add_argument("--rows", default="4,8,16", help="Rows per step, comma-separated.")
    parser.add_argument("--optimizer", default="lamb")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3, help="Steps per round and setting.")
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    args = parser.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    if len(args.rows) < 2:
        parser.error("--rows needs at least two row counts to fit a line")
    return args


def fit_line(rows: list[int], step_ms: list[float]) -> tuple[float, float]:
    """(fixed ms, ms per row): the least-squares line through (rows, step ms)."""
    per_row, fixed = np.polyfit(np.asarray(rows, float), np.asarray(step_ms, float), 1)
    return float(fixed), float(per_row)


def main() -> None:
    args = parse_args()
    data = demo.prepare_data(args.data_dir, dupe_factor=args.dupe_factor)
    packing_factor = data["strategies"]["packing_factor"]
    setups, batches = {}, {}
    for layout in LAYOUTS:
        for rows in args.rows:
            config = demo.pretraining_config(
                args.data_dir, layout == "packed", 0.0, recipe=cpu_pretrain
            )
            config.optimizer.name = args.optimizer
            config.train.packing_hparams = "none"  # exactly `rows` rows a step
            config.train.batch_size = rows
            setups[layout, rows] = setup = create_train_setup(config)
            batches[layout, rows] = setup.first_train_batches(3)
    timings = side_by_side(setups, batches, rounds=args.rounds, steps=args.steps)
    step_ms = {
        layout: {
            r: 1e3 * float(np.median(timings[layout, r].round_step_seconds)) for r in args.rows
        }
        for layout in LAYOUTS
    }
    lines = {layout: fit_line(args.rows, list(step_ms[layout].values())) for layout in LAYOUTS}
    padded_rows = cpu_pretrain.get_config().train.batch_size
    packed_rows = padded_rows / packing_factor
    at = lambda layout, rows: lines[layout][0] + lines[layout][1] * rows
    speedup = at("padded", padded_rows) / at("packed", packed_rows)  # the same sequences a step
    result = {
        "optimizer": args.optimizer,
        "packing_factor": packing_factor,
        "step_ms": step_ms,
        "fixed_ms": {layout: lines[layout][0] for layout in LAYOUTS},
        "per_row_ms": {layout: lines[layout][1] for layout in LAYOUTS},
        "recipe_rows": {"padded": padded_rows, "packed": packed_rows},
        "recipe_speedup": speedup,
        "recipe_speedup_over_packing_factor": speedup / packing_factor,
    }
    print(f"{args.optimizer}, packing factor {packing_factor:.2f}; median step ms by rows:")
    for layout in LAYOUTS:
        fixed, per_row = lines[layout]
        times = "  ".join(f"{r}: {ms:.1f}" for r, ms in step_ms[layout].items())
        print(f"  {layout:<7} {times}   -> {fixed:.1f} ms a step + {per_row:.1f} ms a row")
    print(
        f"the recipe's step ({padded_rows} padded rows, {packed_rows:.1f} packed): speed-up "
        f"{speedup:.2f}x = {speedup / packing_factor:.2f} x the packing factor"
    )
    if args.json:
        publish("step_cost", result)


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def step_cost_block(read: Read) -> str:
    items = [
        {"run": run["date"], "layout": layout, **run["result"]}
        for run in runs("step_cost", read)
        for layout in run["result"]["step_ms"]
    ]
    at = lambda r, key: r[key][r["layout"]]
    line = lambda r: at(r, "fixed_ms") + at(r, "per_row_ms") * at(r, "recipe_rows")
    columns: Columns = {
        "run": lambda r: r["run"],
        "layout": lambda r: r["layout"],
        **{
            f"{rows} rows": (lambda r, rows=rows: at(r, "step_ms")[rows])
            for rows in items[0]["step_ms"]["packed"]
        },
        "fixed ms a step": lambda r: at(r, "fixed_ms"),
        "ms a row": lambda r: at(r, "per_row_ms"),
        "fixed share at the recipe's rows": lambda r: share(at(r, "fixed_ms") / line(r)),
        "recipe's step: speed-up": lambda r: (
            f"{times(r['recipe_speedup'])} = {r['recipe_speedup_over_packing_factor']:.2f} p"
            if r["layout"] == "packed"
            else ""
        ),
    }
    sources = "\n\n".join(run_sources("step_cost", read))
    r = items[-1]
    return (
        f"{sources}\n\nMedian step ms by rows a step, {r['optimizer'].upper()}; the recipe's step "
        f"is {r['recipe_rows']['padded']} padded rows or {r['recipe_rows']['packed']} packed "
        f"(packing factor p = {r['packing_factor']}):\n\n{items_table(items, columns)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"step_cost": step_cost_block}


if __name__ == "__main__":
    main()
