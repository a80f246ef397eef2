r"""Packed vs padded learning per sequence, past the plateau, and what pre-training is worth.

    python -m benchmarks.studies.learning_curves --json  # 3 seeds: about 35 minutes on 2 cores
    python -m benchmarks.studies.learning_curves --recipe=cpu_pretrain --steps=800 --json   # AdamW

The demo's recipe (`bert_flax.demo.RECIPE`, or --recipe, a module of configs/) on its data
(`configs/cpu_pretrain.py`'s `PREPARE`, prepared once in --workdir), packed and padded for the same
steps (by default about what the demo's packed run takes in its 3 minutes); a step sees the same
number of sequences either way (`divide_accumulation`), so both curves cover the same sequences.
The learning rate stays at its peak after the warm-up (as in `make demo`). Both layouts are
evaluated on the same padded held-out rows every --eval_every steps. Per layout and evaluation: the
median and spread (min, max) over seeds of eval masked-LM accuracy, against the median sequences
seen. The gap is |packed - padded| of the medians at each evaluation where both are past the
plateau (above --plateau, 0.15 by default); the target is at most 0.01 at every such evaluation.

Then fine-tuning on the bundled sentiment set (`bert_flax.demo.finetune_both`, --finetune_epochs)
from each seed's packed model and from random initialisation: median best validation accuracy.

A run whose workdir holds it finished, of the same config, data and code, is reused
(`finished.reusable_run`); a workdir of another run is moved aside and trained afresh.

With --json the last line is a JSON object: packing_factor, mlm_accuracy_packed,
mlm_accuracy_padded (final medians), max_curve_gap (None when no evaluation passed the plateau),
finetune_pretrained, finetune_random, baseline, reused (the workdirs of reused runs), and the
curves.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable

import numpy as np

from benchmarks.lib import recipe_data
from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, source
from bert_flax import demo
from bert_flax.runs import finished
from bert_flax.runs.metrics import learning_curve
from bert_flax.tasks import PreTrainingTask
from bert_flax.train import loop

METRIC = "masked_lm_accuracy"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="workdir/bench/learning_curves")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--recipe",
        default=demo.RECIPE.__name__.removeprefix("configs."),
        help="A pre-training config module of configs/ (default: the demo's).",
    )
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--eval_every", type=int, default=200)
    parser.add_argument("--plateau", type=float, default=0.15)
    parser.add_argument(
        "--finetune_epochs", type=float, default=1.0, help="As the demo's; 0 skips it."
    )
    recipe_data.add_flag(parser)
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    return parser.parse_args()


def pretrain(args, data_dir: str, layout: str, seed: int) -> tuple[str, dict]:
    config = demo.pretraining_config(
        data_dir,
        layout == "packed",
        0.0,
        args.steps,
        seed,
        eval_every=args.eval_every,
        recipe=importlib.import_module(f"configs.{args.recipe}"),
    )
    workdir = os.path.join(args.workdir, f"{layout}_seed{seed}")
    reused = finished.reusable_run(workdir, config, PreTrainingTask(config))
    final = reused or loop.train_and_evaluate(config, workdir)
    loop.exit_if_preempted(final)  # SIGTERM stops the benchmark, not only the run it hit
    return workdir, final


def median_curve(workdirs: list[str]) -> dict[str, list[float]]:
    """Median (and min, max) over runs of the evaluations all of them reached."""
    curves = [learning_curve(w, METRIC) for w in workdirs]
    evals = min(len(c["step"]) for c in curves)
    stacked = {k: np.array([c[k][:evals] for c in curves]) for k in ("sequences_seen", METRIC)}
    return {
        "step": curves[0]["step"][:evals],
        "sequences_seen": np.median(stacked["sequences_seen"], axis=0).tolist(),
        METRIC: np.median(stacked[METRIC], axis=0).tolist(),
        f"{METRIC}_min": stacked[METRIC].min(axis=0).tolist(),
        f"{METRIC}_max": stacked[METRIC].max(axis=0).tolist(),
    }


def max_gap(packed: dict, padded: dict, plateau: float) -> float | None:
    gaps = [
        abs(a - b) for a, b in zip(packed[METRIC], padded[METRIC]) if a > plateau and b > plateau
    ]
    return max(gaps) if gaps else None


def main() -> None:
    args = parse_args()
    data_dir, data = recipe_data.prepare(args)
    runs: dict[str, list[str]] = {layout: [] for layout in demo.LAYOUTS}
    baseline, tuned = float("nan"), {start: [] for start in demo.FINETUNE_STARTS}
    reused: list[str] = []
    for seed in range(args.seeds):
        for layout in demo.LAYOUTS:
            workdir, final = pretrain(args, data_dir, layout, seed)
            runs[layout].append(workdir)
            if final.get("reused"):
                reused.append(workdir)
            baseline = final["baseline"]
        if args.finetune_epochs > 0:
            pretrained = runs["packed"][-1]
            both = demo.finetune_both(
                args.workdir, data_dir, pretrained, args.finetune_epochs, seed
            )
            for start, final in both.items():
                tuned[start].append(final["best"]["value"])
                if final.get("reused"):
                    reused.append(demo.finetune_dir(args.workdir, start, seed))
    curves = {layout: median_curve(workdirs) for layout, workdirs in runs.items()}
    print(f"eval masked-LM accuracy (median of {args.seeds} seeds; baseline {baseline:.4f})")
    print(f"{'step':>6} {'sequences':>10} {'packed':>8} {'padded':>8}")
    for i, step in enumerate(curves["packed"]["step"][: len(curves["padded"]["step"])]):
        seen = curves["packed"]["sequences_seen"][i]
        row = [curves[layout][METRIC][i] for layout in demo.LAYOUTS]
        print(f"{step:>6} {seen:>10,.0f} {row[0]:>8.4f} {row[1]:>8.4f}")
    result = {
        "packing_factor": data["strategies"]["packing_factor"],
        "recipe": args.recipe,
        "seeds": args.seeds,
        "steps": args.steps,
        "baseline": baseline,
        "mlm_accuracy_packed": curves["packed"][METRIC][-1],
        "mlm_accuracy_padded": curves["padded"][METRIC][-1],
        "max_curve_gap": max_gap(curves["packed"], curves["padded"], args.plateau),
        "finetune_pretrained": float(np.median(tuned["pre-trained"])) if tuned["random"] else None,
        "finetune_random": float(np.median(tuned["random"])) if tuned["random"] else None,
        "reused": reused,
        "curves": curves,
    }
    print(
        f"max gap past {args.plateau}: {result['max_curve_gap']}; fine-tuning "
        f"{result['finetune_pretrained']} pre-trained vs {result['finetune_random']} random"
    )
    if args.json:
        publish("learning_curves", result)


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def learning_curves_row(read: Read) -> tuple[str, str]:
    r = read("learning_curves")["result"]
    return (
        f"learning curves, packed vs padded per sequence ({r['seeds']} seeds, {r['steps']} steps)",
        f"largest gap past the plateau {100 * r['max_curve_gap']:.2f} points (to "
        f"{r['mlm_accuracy_packed']:.3f}; baseline {r['baseline']:.3f})",
    )


def learning_curves_block(read: Read) -> str:
    r = read("learning_curves")["result"]
    curves, metric = r["curves"], "masked_lm_accuracy"
    span = lambda layout, i: "{} ({}-{})".format(
        *(curves[layout][f"{metric}{end}"][i] for end in ("", "_min", "_max"))
    )
    gap = lambda i: curves["packed"][metric][i] - curves["padded"][metric][i]
    columns: Columns = {
        "step": lambda i: curves["packed"]["step"][i],
        "packed (min-max)": lambda i: span("packed", i),
        "padded (min-max)": lambda i: span("padded", i),
        "gap (points)": lambda i: f"{100 * gap(i):+.2f}",
    }
    evaluations = list(range(len(curves["packed"]["step"])))
    return (
        f"{source('learning_curves', read)}\n\nEval masked-LM accuracy, median of {r['seeds']} "
        f"seeds (most-frequent-token baseline {r['baseline']}, packing factor "
        f"{r['packing_factor']}):\n\n{items_table(evaluations, columns)}\n\nFine-tuned from the "
        f"packed run: {r['finetune_pretrained']} validation accuracy; from a random start "
        f"{r['finetune_random']}."
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"learning_curves": learning_curves_block}
README_ROW = (
    learning_curves_row,
    "`python -m benchmarks.studies.learning_curves --json --recipe=cpu_pretrain --steps=800 "
    "--eval_every=200 --finetune_epochs=1` "
    "([results](docs/results.md#packed-and-padded-learn-alike-per-sequence))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
