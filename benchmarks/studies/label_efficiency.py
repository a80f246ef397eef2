r"""Pre-training where labels are scarce: fine-tuning accuracy against the number of labelled
examples, from the demo's pre-trained model and from a random start.

    # 5 sizes x 2 starts x 3 seeds, grid at 1,000
    python -m benchmarks.studies.label_efficiency --json
    # make demo's model
    python -m benchmarks.studies.label_efficiency --pretrained=workdir/demo/packed
    python -m benchmarks.studies.label_efficiency --sizes=100,1000 --seeds=1 --grid=1e-3

The pre-trained model is the demo's packed run (`bert_flax.demo`: its data, its recipe) trained
for --pretrain_steps steps (about what its 3 minutes give on an idle machine, so that a loaded
machine does not make a weaker model), or --pretrained=RUN. Each start fine-tunes as the demo
does (`demo.finetuning_config`: packed rows, the mean of the states, the pre-trained tables at a
fresh start's size) on a stratified sample of n training examples (`config.data.train_examples`:
the same sample for both starts and every seed, and part of every larger one), for --epochs
epochs but at least --min_steps steps (a sample of 100 makes 3 steps an epoch), evaluated
--evaluations times on the whole validation split with the best parameters kept; the test split
is then classified with them.

Learning rate: each start's is the one of --grid with the best validation accuracy at
--tune_size examples (seed 0), then used at every size and seed. Per size: the median over
seeds of each start's best validation accuracy (and test accuracy), the gain (pre-trained minus
random, of the medians) and the majority-class baseline. A finished run of the same config, data
and code is reused (`finished.reusable_run`) and listed in `reused`. With --json the last line is a
JSON object: sizes, learning_rates, per size `pretrained`, `random` (medians), `gain`,
`test_gain`, `runs` (every seed's figures), and `baseline`; a plot of both curves is written to
--workdir/label_efficiency.png (--plot copies it, e.g. into docs/images/).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

from benchmarks.lib.records import Read, finish
from benchmarks.lib.render import Columns, items_table, points, source
from bert_flax import demo
from bert_flax.runs import finished
from bert_flax.runs.pretrained import pretrained_vocab_file
from bert_flax.tasks import ClassificationTask
from bert_flax.train import loop

ALL = 0  # config.data.train_examples: the whole train split
STARTS = demo.FINETUNE_STARTS  # ("pre-trained", "random")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="workdir/bench/label_efficiency")
    parser.add_argument("--pretrained", default="", help="A pre-training run (default: train it).")
    parser.add_argument("--pretrain_steps", type=int, default=1600)
    parser.add_argument("--sizes", default="100,300,1000,3000,0", help="Examples; 0: all.")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--grid", default="3e-4,1e-3,3e-3", help="Learning rates tried.")
    parser.add_argument("--tune_size", type=int, default=1000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--min_steps", type=int, default=300)
    parser.add_argument("--evaluations", type=int, default=10)
    parser.add_argument("--plot", default="", help="Also copy the plot here.")
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    return parser.parse_args()


def finetuned(args, pretrained: str, start: str, size: int, rate: float, seed: int) -> dict:
    """One fine-tuning run's final metrics (reused when it is the same run)."""
    # Both starts tokenize with the pre-training data's vocabulary (`finetuning_config`).
    data_dir = os.path.dirname(pretrained_vocab_file(pretrained))
    init_from = pretrained if start == "pre-trained" else ""
    config = demo.finetuning_config(data_dir, init_from, args.epochs, seed)
    config.data.train_examples = size
    config.schedule.learning_rate = rate
    config.train.min_steps = args.min_steps
    config.eval.evaluations = args.evaluations
    name = f"{start.replace('-', '')}_n{size or 'all'}_lr{rate:g}_seed{seed}"
    workdir = os.path.join(args.workdir, name)
    task = ClassificationTask(config)
    final = finished.reusable_run(workdir, config, task) or loop.train_and_evaluate(
        config, workdir, task=task
    )
    loop.exit_if_preempted(final)
    # A reused run's final metrics predate its test predictions: classify the test split again.
    test = final.get("test") or task.predict_split(workdir, "test")
    return {
        "validation": final["best"]["value"],
        "test": test["accuracy"],
        "steps": final["step"],
        "train_examples": len(task.labelled.splits["train"]),
        "baseline": final["baseline"],
        "reused": bool(final.get("reused")),
        "workdir": workdir,
    }


def tuned_rates(args, pretrained: str, grid: list[float]) -> dict[str, float]:
    """Per start, the rate of `grid` with the best validation accuracy at --tune_size, seed 0."""
    rates = {}
    for start in STARTS:
        scores = {
            rate: finetuned(args, pretrained, start, args.tune_size, rate, 0) for rate in grid
        }
        for rate, run in scores.items():
            print(f"  tune {start:>11} lr {rate:g}: validation {run['validation']:.4f}")
        rates[start] = max(grid, key=lambda rate: scores[rate]["validation"])
    return rates


def median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def plot_label_efficiency(
    examples: list[int], curves: dict[str, list[float]], baseline: float, path: str
) -> str:
    """Validation accuracy against labelled training examples (log scale), one curve per
    start, the majority-class baseline drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, accuracy in curves.items():
        ax.plot(examples, accuracy, "o-", label=name)
    ax.axhline(baseline, color="gray", ls=":", label="majority class")
    ax.set_xscale("log")
    ax.set(xlabel="labelled training examples", ylabel="validation accuracy",
           title="Fine-tuning with few labels")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    args = parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    pretrained = args.pretrained or demo.pretrained_model(args.workdir, args.pretrain_steps)
    rates = tuned_rates(args, pretrained, [float(r) for r in args.grid.split(",")])
    rows, reused = [], []
    for size in [int(s) for s in args.sizes.split(",")]:
        runs = {
            start: [finetuned(args, pretrained, start, size, rates[start], seed)
                    for seed in range(args.seeds)]
            for start in STARTS
        }  # fmt: skip
        reused += [run["workdir"] for each in runs.values() for run in each if run["reused"]]
        row = {
            "train_examples": runs["random"][0]["train_examples"],
            "steps": runs["random"][0]["steps"],
            "pretrained": median(runs["pre-trained"], "validation"),
            "random": median(runs["random"], "validation"),
            "pretrained_test": median(runs["pre-trained"], "test"),
            "random_test": median(runs["random"], "test"),
            "runs": {start: [{k: r[k] for k in ("validation", "test")} for r in each]
                     for start, each in runs.items()},
        }  # fmt: skip
        row["gain"] = row["pretrained"] - row["random"]
        row["test_gain"] = row["pretrained_test"] - row["random_test"]
        rows.append(row)
        print(
            f"{row['train_examples']:>6} examples ({row['steps']} steps): pre-trained "
            f"{row['pretrained']:.4f}, random {row['random']:.4f}, gain {100 * row['gain']:+.1f} "
            f"points (test {100 * row['test_gain']:+.1f})",
            flush=True,
        )
    result = {
        "pretrained_run": pretrained,
        "seeds": args.seeds,
        "learning_rates": rates,
        "grid": args.grid,
        "tune_size": args.tune_size,
        "epochs": args.epochs,
        "min_steps": args.min_steps,
        "baseline": runs["random"][0]["baseline"],
        "sizes": rows,
        "reused": reused,
    }
    path = plot_label_efficiency(
        [row["train_examples"] for row in rows],
        {f"from {start} (median of {args.seeds})": [row[key] for row in rows]
         for start, key in zip(STARTS, ("pretrained", "random"))},
        result["baseline"],
        os.path.join(args.workdir, "label_efficiency.png"),
    )  # fmt: skip
    finish("label_efficiency", result, path, args.plot, args.json)


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def label_efficiency_row(read: Read) -> tuple[str, str]:
    r = read("label_efficiency")["result"]
    gains = ", ".join(f"{points(s['gain'])} at {s['train_examples']:,}" for s in r["sizes"])
    return (
        f"fine-tuning with few labels: the demo's pre-trained model vs a random start (median "
        f"of {r['seeds']} seeds, validation accuracy; majority class {r['baseline']:.3f})",
        f"gain in points by labelled examples: {gains}",
    )


LABEL_EFFICIENCY_COLUMNS: Columns = {
    "labelled examples": lambda s: f"{s['train_examples']:,}",
    "steps": lambda s: s["steps"],
    "pre-trained": lambda s: f"{s['pretrained']:.4f}",
    "random": lambda s: f"{s['random']:.4f}",
    "gain (points)": lambda s: points(s["gain"]),
    "test: pre-trained": lambda s: f"{s['pretrained_test']:.4f}",
    "test: random": lambda s: f"{s['random_test']:.4f}",
    "test gain": lambda s: points(s["test_gain"]),
}


def label_efficiency_block(read: Read) -> str:
    r = read("label_efficiency")["result"]
    rates = ", ".join(f"{start} {rate:g}" for start, rate in r["learning_rates"].items())
    return (
        f"{source('label_efficiency', read)}\n\nValidation accuracy (the whole split; the "
        f"majority class scores {r['baseline']:.4f}), median of {r['seeds']} seeds; learning "
        f"rates {rates}, each start's best of {r['grid']} at {r['tune_size']:,} examples; "
        f"{r['epochs']:g} epoch, at least {r['min_steps']} steps:\n\n"
        f"{items_table(r['sizes'], LABEL_EFFICIENCY_COLUMNS)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"label_efficiency": label_efficiency_block}
README_ROW = (
    label_efficiency_row,
    "`python -m benchmarks.studies.label_efficiency --json` "
    "([results](docs/results.md#fine-tuning-with-few-labels))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
