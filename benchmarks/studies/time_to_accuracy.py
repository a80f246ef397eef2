r"""Time to accuracy: the project's thesis in one number, packed + second-order vs padded + LAMB.

    python -m benchmarks.studies.time_to_accuracy --json  # the full grid: many hours
    python -m benchmarks.studies.time_to_accuracy --seeds=1 --grid=1 \
        --rows=padded+lamb,packed+soap --json
    python -m benchmarks.studies.time_to_accuracy --rows=padded+lamb,packed+soap \
        --learning_rates=padded+lamb=5e-3,packed+soap=2e-3 \
        --name=time_to_accuracy_at_chosen_rates --json
    python -m benchmarks.studies.time_to_accuracy --config=configs/bert_base_shampoo.py:phase1 \
        --data_dir=$DATA_128 --rows=packed+lamb,packed+shampoo,packed+soap \
        --learning_rates=packed+lamb=6e-3,packed+shampoo=1.6e-3,packed+soap=1.6e-3 \
        --target=0.5 --max_minutes=120 --name=time_to_accuracy_bert_base --json

The recipe of `configs/cpu_pretrain.py` on its data (`PREPARE`, prepared once in --workdir),
trained by each row (a layout and an optimizer) until its eval masked-LM accuracy reaches
--target (past the unigram plateau: the most-frequent-token baseline is about 0.07) or its
budget (--max_minutes, --max_steps) runs out; runs stop at the first evaluation at or above the
target (`config.eval.stop_at`), every --eval_every steps, on the same padded held-out rows. A step
sees the same number of sequences packed or padded (`divide_accumulation`), so packing's gain is
time, and the optimizers are compared per step and per second alike.

`--config=path[:argument]` trains another recipe instead, on its prepared --data_dir (the
BERT-base comparison on a v5e-8 above: docs/optim.md, "BERT-base on a v5e-8"): the rows set
its optimizer (and its section's settings of the row), learning rate, layout, budget and
evaluation; the rest, packing's hyper-parameters included, is the config's.

Learning rates: every row gets the same budget, a grid of --grid points around its optimizer's
centre (`CENTRE_LEARNING_RATES`, spaced by factors of 2), each run with seed 0; the rate that
reaches the target soonest in seconds (or, when none does, ends highest) is then run with the
other seeds. `--learning_rates` gives rows a rate instead (a published choice: the rerun above
repeats the headline's rows at the rates the grid chose, without the grid's hours, into its own
results file, --name). Runs are interleaved (for each grid point and seed, every row in turn),
so a change in the machine's load falls on all rows alike; run it on an idle machine all the
same, and alone.

Studies, run when named in --rows: SOAP's staleness, `packed+soap-sync` (eigenbases in the graph,
never stale) and `packed+soap-every100` (on the host every 100 steps, not 10); and Shampoo's
statistics on every fifth update only, `packed+shampoo-stats5` (`statistics_compute_steps=5`).

Per row: the median over seeds of training seconds (steps only: not evaluation, not compiling the
step, which is reported beside them as compile_seconds), steps and sequences to the target. With
--json the last line is a JSON object: target, baseline, packing_factor, seconds_to_target,
steps_to_target, sequences_to_target (dicts keyed by row, None where a seed missed the target),
compile_seconds, learning_rates (chosen; learning_rates_given: the rows not tuned),
speedup_vs_padded_lamb; race (the best second-order packed row over the best first-order one,
in steps and in seconds, and which rows those are);
step_time_over_packed_lamb (each packed row's training-loop step, host work included, over packed +
LAMB's, timed in turns on the same batches: [median, relative error]); reused (the workdirs of runs
reused as they were: `finished.reusable_run`, finished and of the same config, data and code; a
workdir of another run is moved aside and trained afresh).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import numpy as np

from benchmarks.lib import recipe_data
from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, source, times
from bert_flax import demo
from bert_flax.input_pipeline.contract import PreparedData
from bert_flax.runs import finished
from bert_flax.runs.metrics import learning_curve
from bert_flax.tasks import PreTrainingTask
from bert_flax.train import loop
from bert_flax.train.overrides import load_config_file
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import paired_ratio, side_by_side
from configs import cpu_pretrain

METRIC = "masked_lm_accuracy"
BASELINE_ROW = "padded+lamb"
# Row -> (packed, optimizer, that optimizer's settings beyond its defaults).
ROWS: dict[str, tuple[bool, str, dict]] = {
    BASELINE_ROW: (False, "lamb", {}),
    "packed+lamb": (True, "lamb", {}),
    "packed+adamw": (True, "adamw", {}),
    "packed+muon": (True, "muon", {}),
    "packed+shampoo": (True, "shampoo", {"asynchronous": True}),
    "packed+soap": (True, "soap", {"asynchronous": True}),
}
# Studies (not run by default: name them in --rows). SOAP's staleness: the eigenbases computed in
# the graph every 10 steps (no staleness), and on the host every 100 steps instead of 10.
# Shampoo's statistics accumulated on every fifth update only.
STUDY_ROWS: dict[str, tuple[bool, str, dict]] = {
    "packed+soap-sync": (True, "soap", {"asynchronous": False}),
    "packed+soap-every100": (
        True,
        "soap",
        {"asynchronous": True, "preconditioning_compute_steps": 100},
    ),
    "packed+shampoo-stats5": (
        True,
        "shampoo",
        {"asynchronous": True, "statistics_compute_steps": 5},
    ),
}
ALL_ROWS = {**ROWS, **STUDY_ROWS}
# The race among packed rows: the best second-order optimizer against the best first-order one.
STEP_TIME_REFERENCE = "packed+lamb"  # what the packed rows' step times are divided by
FIRST_ORDER_ROWS = (STEP_TIME_REFERENCE, "packed+adamw", "packed+muon")
SECOND_ORDER_ROWS = ("packed+shampoo", "packed+soap")
# The middle of each optimizer's grid: the recipe's AdamW rate, and where each of the others
# reached the plateau's exit first in short runs of the recipe.
CENTRE_LEARNING_RATES = {
    "lamb": 1e-2,
    "adamw": 2e-3,
    "muon": 2e-2,
    "shampoo": 2e-3,
    "soap": 4e-3,  # configs/cpu_pretrain_soap.py's: the best of (1e-3, 2e-3, 4e-3) at target 0.2
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="workdir/bench/time_to_accuracy")
    parser.add_argument("--target", type=float, default=0.25)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--grid", type=int, default=3, help="Learning rates per row (odd).")
    parser.add_argument("--rows", default=",".join(ROWS), help="Comma-separated rows.")
    parser.add_argument("--max_minutes", type=float, default=20.0, help="Budget of one run.")
    parser.add_argument("--max_steps", type=int, default=10_000)
    parser.add_argument("--eval_every", type=int, default=100)
    parser.add_argument("--speed_rounds", type=int, default=6, help="Step-time rounds (0: none).")
    parser.add_argument(
        "--learning_rates", default="",
        help="ROW=RATE,...: these rows train at RATE only (no grid), e.g. a published choice.",
    )  # fmt: skip
    recipe_data.add_flag(parser)
    parser.add_argument(
        "--config", default="",
        help="path[:argument] of the recipe trained (default: configs/cpu_pretrain.py)",
    )  # fmt: skip
    parser.add_argument("--data_dir", default="", help="Prepared data of --config's recipe.")
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    parser.add_argument("--name", default="time_to_accuracy", help="The results file's name.")
    args = parser.parse_args(argv)
    args.rows = args.rows.split(",")
    unknown = sorted(set(args.rows) - set(ALL_ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {list(ALL_ROWS)}")
    pairs = [pair.split("=") for pair in args.learning_rates.split(",") if pair]
    if any(len(pair) != 2 or pair[0] not in args.rows for pair in pairs):
        parser.error(f"--learning_rates={args.learning_rates}: give ROW=RATE for rows of --rows")
    args.learning_rates = {row: float(rate) for row, rate in pairs}
    if args.grid < 1 or args.grid % 2 == 0:
        parser.error(f"--grid={args.grid} must be odd (the centre and pairs around it)")
    if bool(args.config) != bool(args.data_dir):
        parser.error("--config and --data_dir go together: the recipe and the data prepared for it")
    return args


def learning_rate_grid(centre: float, points: int) -> list[float]:
    """``points`` rates around ``centre``, spaced by factors of 2 (the centre in the middle)."""
    half = points // 2
    return [centre * 2.0**k for k in range(-half, half + 1)]


def row_grids(args: argparse.Namespace) -> dict[str, list[float]]:
    """Each row's rates for seed 0: its --learning_rates rate alone, else the grid."""
    return {
        row: [args.learning_rates[row]]
        if row in args.learning_rates
        else learning_rate_grid(CENTRE_LEARNING_RATES[ALL_ROWS[row][1]], args.grid)
        for row in args.rows
    }


def time_to_target(curve: dict[str, list[float]], target: float) -> dict[str, float] | None:
    """Training seconds, steps and sequences at the first evaluation at or above ``target``."""
    for i, value in enumerate(curve[METRIC]):
        if value >= target:
            return {
                "seconds": curve["train_seconds"][i],
                "steps": curve["step"][i],
                "sequences": curve["sequences_seen"][i],
            }
    return None


def best_learning_rate(trials: dict[float, dict]) -> float:
    """The rate that reached the target in the fewest seconds; if none did, the highest final
    accuracy."""
    reached = {lr: t["to_target"]["seconds"] for lr, t in trials.items() if t["to_target"]}
    if reached:
        return min(reached, key=reached.get)
    return max(trials, key=lambda lr: trials[lr]["final_accuracy"])


def row_config(args, data_dir: str, row: str, learning_rate: float, seed: int):
    """The recipe trained by ``row`` at ``learning_rate`` (held after warm-up) to the target."""
    packed, optimizer, settings = ALL_ROWS[row]
    recipe = cpu_pretrain
    if args.config:  # what `demo.pretraining_config` takes: anything with a get_config()
        recipe = SimpleNamespace(get_config=lambda: load_config_file(args.config))
    config = demo.pretraining_config(
        data_dir,
        packed,
        args.max_minutes,
        args.max_steps,
        seed,
        eval_every=args.eval_every,
        recipe=recipe,
    )
    config.optimizer.name = optimizer
    config.optimizer[optimizer].update(settings)
    config.schedule.learning_rate = config.schedule.end_learning_rate = learning_rate
    config.eval.stop_at = args.target
    return config


def run(args, data_dir: str, row: str, learning_rate: float, seed: int) -> dict:
    """One training run of ``row``: its workdir's finished run if it is the same run (a rerun
    would train on past its target), else trained (resumed if interrupted)."""
    config = row_config(args, data_dir, row, learning_rate, seed)
    workdir = os.path.join(args.workdir, row, f"lr{learning_rate:.2e}_seed{seed}")
    reused = finished.reusable_run(workdir, config, PreTrainingTask(config))
    final = reused or loop.train_and_evaluate(config, workdir)
    loop.exit_if_preempted(final)  # SIGTERM stops the benchmark, not only the run it hit
    curve = learning_curve(workdir, METRIC)
    return {
        "workdir": workdir,
        "reused": reused is not None,
        "to_target": time_to_target(curve, args.target),
        "final_accuracy": curve[METRIC][-1] if curve[METRIC] else float("nan"),
        "baseline": final["baseline"],
        "compile_seconds": final.get("compile_seconds", float("nan")),
    }


def median_or_none(values: list[float | None]) -> float | None:
    """The median, or None when any seed missed the target (a median would hide it)."""
    return None if any(v is None for v in values) else float(np.median(values))


def summarize(args, trials: dict, chosen: dict, packing_factor: float, baseline: float) -> dict:
    """The JSON result from every row's runs at its chosen rate."""
    figures = {key: {} for key in ("seconds", "steps", "sequences")}
    for row in args.rows:
        runs = [trials[row][chosen[row], seed]["to_target"] for seed in range(args.seeds)]
        for key in figures:
            figures[key][row] = median_or_none([r and r[key] for r in runs])
    seconds = figures["seconds"]
    padded = seconds.get(BASELINE_ROW)
    return {
        "target": args.target,
        "baseline": baseline,
        "packing_factor": packing_factor,
        "seeds": args.seeds,
        "grid": args.grid,
        "learning_rates_given": sorted(args.learning_rates),  # rows not tuned: no grid run
        "learning_rates": chosen,
        "seconds_to_target": seconds,
        "steps_to_target": figures["steps"],
        "sequences_to_target": figures["sequences"],
        "compile_seconds": {
            row: float(
                np.median(
                    [trials[row][chosen[row], s]["compile_seconds"] for s in range(args.seeds)]
                )
            )
            for row in args.rows
        },
        "speedup_vs_padded_lamb": {
            row: (padded / s if padded and s else None) for row, s in seconds.items()
        },
    }


def race(result: dict) -> dict:
    """The packed rows' race: the best second-order row (fewest steps, fewest seconds) over the
    best first-order one; None where a side is missing or every row of it missed the target."""

    def best(rows: Sequence[str], key: str) -> tuple[str, float] | None:
        reached = {r: result[key][r] for r in rows if result[key].get(r) is not None}
        return min(reached.items(), key=lambda item: item[1]) if reached else None

    figures = {}
    for key, name in (("steps_to_target", "steps"), ("seconds_to_target", "seconds")):
        first, second = best(FIRST_ORDER_ROWS, key), best(SECOND_ORDER_ROWS, key)
        figures[f"{name}_second_over_first_order"] = (
            second[1] / first[1] if first and second else None
        )
        figures[f"by_{name}"] = [first and first[0], second and second[0]]
    return figures


def step_times(args, data_dir: str, chosen: dict[str, float]) -> dict[str, list[float]]:
    """Each packed row's training-loop step (host work included) at its chosen rate, timed in
    turns on the same real batches (--speed_rounds rounds of 5 steps), as (median, relative
    error) of its step time over packed + LAMB's."""
    rows = [row for row in chosen if ALL_ROWS[row][0]]
    if args.speed_rounds == 0 or STEP_TIME_REFERENCE not in rows:
        return {}
    setups = {
        row: create_train_setup(row_config(args, data_dir, row, chosen[row], seed=0))
        for row in rows
    }
    batches = {row: setup.first_train_batches(5) for row, setup in setups.items()}
    timings = side_by_side(setups, batches, rounds=args.speed_rounds, steps=5)
    reference = timings[STEP_TIME_REFERENCE].round_step_seconds
    return {row: list(paired_ratio(t.round_step_seconds, reference)) for row, t in timings.items()}


def print_table(result: dict) -> None:
    print(
        f"\nto eval masked-LM accuracy {result['target']} (baseline {result['baseline']:.4f}; "
        f"median of {result['seeds']} seeds; packing factor {result['packing_factor']:.2f})"
    )
    widths = (9, 9, 7, 10, 9, 10)
    head = ("lr", "seconds", "steps", "sequences", "speed-up", "step/LAMB")
    print(f"{'row':>20} " + " ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
    for row, lr in result["learning_rates"].items():
        cells = [
            result[key][row]
            for key in ("seconds_to_target", "steps_to_target", "sequences_to_target")
        ]
        text = [("missed" if c is None else f"{c:,.0f}") for c in cells]
        speedup = result["speedup_vs_padded_lamb"][row]
        text.append("-" if speedup is None else f"{speedup:.2f}x")
        step = result["step_time_over_packed_lamb"].get(row)
        text.append("-" if step is None else f"{step[0]:.2f}+-{step[1]:.0%}")
        print(f"{row:>20} {lr:>9.2e} " + " ".join(f"{t:>{w}}" for t, w in zip(text, widths[1:])))
    race = result["race"]
    for name in ("steps", "seconds"):
        ratio = race[f"{name}_second_over_first_order"]
        first, second = race[f"by_{name}"]
        if ratio is not None:
            print(
                f"best second-order ({second}) over best first-order ({first}) {name}: {ratio:.2f}"
            )


def main() -> None:
    args = parse_args()
    if args.config:
        data_dir, data = args.data_dir, PreparedData.load(args.data_dir).summary
    else:
        data_dir, data = recipe_data.prepare(args)
    grids = row_grids(args)
    trials: dict[str, dict] = {row: {} for row in args.rows}
    baseline = float("nan")
    for k in range(args.grid):  # the grid with seed 0, rows interleaved
        for row in args.rows:
            if k < len(grids[row]):
                trials[row][grids[row][k], 0] = run(args, data_dir, row, grids[row][k], 0)
                baseline = trials[row][grids[row][k], 0]["baseline"]
    chosen = {
        row: best_learning_rate({lr: t for (lr, s), t in trials[row].items() if s == 0})
        for row in args.rows
    }
    for seed in range(1, args.seeds):
        for row in args.rows:
            trials[row][chosen[row], seed] = run(args, data_dir, row, chosen[row], seed)
    result = summarize(args, trials, chosen, data["strategies"]["packing_factor"], baseline)
    result["race"] = race(result)
    result["reused"] = [t["workdir"] for r in trials.values() for t in r.values() if t["reused"]]
    result["step_time_over_packed_lamb"] = step_times(args, data_dir, chosen)
    print_table(result)
    if args.json:
        publish(args.name, result)


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


TIME_TO_ACCURACY_ROWS = {
    "packed+soap": "packed + SOAP",
    "packed+muon": "packed + Muon",
    "packed+shampoo": "packed + Shampoo (async)",
    "packed+lamb": "packed + LAMB",
    "packed+adamw": "packed + AdamW",
}


def time_to_accuracy_row(read: Read) -> tuple[str, str]:
    r = read("time_to_accuracy")["result"]
    speedup, steps = r["speedup_vs_padded_lamb"], r["steps_to_target"]
    seconds = r["seconds_to_target"]["padded+lamb"]  # shown in whole seconds elapsed
    rows = sorted(TIME_TO_ACCURACY_ROWS, key=lambda row: -speedup[row])
    figures = []
    for i, row in enumerate(rows):
        detail = f"{steps[row]:,}" + (" steps" if i == 0 else "")
        if row == "packed+lamb":
            detail += f"; {speedup[row] / r['packing_factor']:.2f} x the packing factor"
        text = f"{TIME_TO_ACCURACY_ROWS[row]} {speedup[row]:.2f}x"
        figures.append((f"**{text}**" if i == 0 else text) + f" ({detail})")
    result = (
        f"time to eval masked-LM accuracy {r['target']:g} (CPU recipe, baseline "
        f"{r['baseline']:.3f}; each row at its {r['grid']}-point grid's best rate, median of "
        f"{r['seeds']} seeds) vs padded + LAMB ({int(seconds)} s, "
        f"{steps['padded+lamb']:,} steps)"
    )
    return result, ", ".join(figures)


def time_to_accuracy_block(read: Read) -> str:
    r = read("time_to_accuracy")["result"]
    missed = lambda value, spec: "missed" if value is None else format(value, spec)
    ratio = lambda row: r.get("step_time_over_packed_lamb", {}).get(row)
    compiled = r.get("compile_seconds")
    columns: Columns = {
        "row": lambda row: row,
        "learning rate": lambda row: r["learning_rates"][row],
        "seconds to target": lambda row: missed(r["seconds_to_target"][row], ".1f"),
        "compile (s)": lambda row: missed(compiled[row], ".1f") if compiled else "not recorded",
        "steps": lambda row: missed(r["steps_to_target"][row], ","),
        "sequences": lambda row: missed(r["sequences_to_target"][row], ","),
        "speed-up vs padded + LAMB": lambda row: times(r["speedup_vs_padded_lamb"][row]),
        "step time / packed + LAMB": lambda row: (
            "{:.2f} ± {:.2f}".format(*ratio(row)) if ratio(row) else "-"
        ),
    }
    return (
        f"{source('time_to_accuracy', read)}\n\nTarget eval masked-LM accuracy {r['target']} "
        f"(most-frequent-token baseline {r['baseline']}), packing factor {r['packing_factor']}, "
        f"medians of {r['seeds']} seeds at each row's best rate of a {r['grid']}-point grid:"
        f"\n\n{items_table(list(r['seconds_to_target']), columns)}"
    )


def time_to_accuracy_at_chosen_rates_block(read: Read) -> str:
    """The headline's rows rerun at the rates the grid chose, beside the published run."""
    before, after = (
        read(name)["result"] for name in ("time_to_accuracy", "time_to_accuracy_at_chosen_rates")
    )
    missed = lambda value, spec: "missed" if value is None else format(value, spec)
    speedup = lambda r, row: (
        "-" if r["speedup_vs_padded_lamb"][row] is None else times(r["speedup_vs_padded_lamb"][row])
    )
    columns: Columns = {
        "row": lambda row: row,
        "learning rate": lambda row: f"{after['learning_rates'][row]:g}",
        "steps, before / after": lambda row: (
            f"{missed(before['steps_to_target'][row], ',.0f')} / "
            f"{missed(after['steps_to_target'][row], ',.0f')}"
        ),
        "seconds, after": lambda row: missed(after["seconds_to_target"][row], ".1f"),
        "compile (s), after": lambda row: f"{after['compile_seconds'][row]:.1f}",
        "speed-up vs padded + LAMB, before / after": lambda row: (
            f"{speedup(before, row)} / {speedup(after, row)}"
        ),
    }
    return (
        f"{source('time_to_accuracy_at_chosen_rates', read)}\n\nBefore: the published run above "
        f"(its "
        f"training seconds then included compiling the first step); after: the same rows at the "
        f"same rates with the fixes (training seconds from the compiled step on, compile seconds "
        f"beside them), target {after['target']}, medians of {after['seeds']} seeds. Seconds are "
        f"not compared across the two runs (machines differ in speed from session to session); "
        f"the speed-ups are ratios within each run:\n\n"
        f"{items_table(list(after['seconds_to_target']), columns)}"
    )


def time_to_accuracy_race_block(read: Read) -> str:
    race = read("time_to_accuracy")["result"]["race"]
    rows = [{"by": by, "rows": race.get(f"by_{by}")} for by in ("steps", "seconds")]
    named = lambda row, i: row["rows"][i] if row["rows"] else "not recorded"
    columns: Columns = {
        "to target": lambda row: row["by"],
        "best first-order row": lambda row: named(row, 0),
        "best second-order row": lambda row: named(row, 1),
        "second-order over first-order": lambda row: times(
            race[f"{row['by']}_second_over_first_order"]
        ),
    }
    return (
        f"{source('time_to_accuracy', read)}\n\nIts `race`: the best second-order packed row "
        f"against the best first-order one:\n\n{items_table(rows, columns)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {
    "time_to_accuracy": time_to_accuracy_block,
    "time_to_accuracy_at_chosen_rates": time_to_accuracy_at_chosen_rates_block,
    "time_to_accuracy_race": time_to_accuracy_race_block,
}
README_ROW = (
    time_to_accuracy_row,
    "`python -m benchmarks.studies.time_to_accuracy --seeds=3 --grid=3 --target=0.25 --json` "
    "([results](docs/results.md#time-to-accuracy))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
