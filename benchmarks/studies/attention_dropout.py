r"""Does BERT need attention-probability dropout? The CPU recipe with and without it, equal steps.

    # 2 rates x 3 seeds x 1,000 steps: ~30 min
    python -m benchmarks.studies.attention_dropout --json

Splash attention (the TPU kernel the compile table predicts fastest at 512) has no dropout on
the attention probabilities; MosaicBERT and Cramming pre-train without it. This trains the CPU
recipe (`configs/cpu_pretrain.py`, packed, on its bundled data prepared once in --workdir) at
each --rates value of `model.attention_dropout_rate` for the same --steps and seeds (the learning
rate held at its peak after the warm-up, as in `make demo`), and reports the final eval
masked-LM accuracy per rate: median, min and max over seeds, against the most-frequent-token
baseline (a comparison on the unigram plateau would say nothing). Finished runs of the same
config, data and code are reused (`finished.reusable_run`).

With --json the last line is a JSON object: per rate the seeds' accuracies and their median,
the baseline and the steps (benchmarks/results/attention_dropout.json).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np

from benchmarks.lib import recipe_data
from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, source
from bert_flax import demo
from bert_flax.runs import finished
from bert_flax.tasks import PreTrainingTask
from bert_flax.train import loop
from configs import cpu_pretrain

METRIC = "masked_lm_accuracy"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="workdir/bench/attention_dropout")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.1, 0.0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    recipe_data.add_flag(parser)
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    return parser.parse_args()


def run(args, data_dir: str, rate: float, seed: int) -> dict:
    config = demo.pretraining_config(data_dir, True, 0.0, args.steps, seed, recipe=cpu_pretrain)
    config.model.attention_dropout_rate = rate
    workdir = os.path.join(args.workdir, f"rate{rate:g}_seed{seed}")
    reused = finished.reusable_run(workdir, config, PreTrainingTask(config))
    final = reused or loop.train_and_evaluate(config, workdir)
    loop.exit_if_preempted(final)
    return final


def main() -> None:
    args = parse_args()
    data_dir, _ = recipe_data.prepare(args)
    accuracies: dict[str, list[float]] = {}
    baseline = float("nan")
    for seed in range(args.seeds):
        for rate in args.rates:
            final = run(args, data_dir, rate, seed)
            accuracies.setdefault(f"{rate:g}", []).append(float(final["eval"][METRIC]))
            baseline = final["baseline"]
    print(f"eval masked-LM accuracy at step {args.steps} over {args.seeds} seeds, packed CPU "
          f"recipe (most-frequent-token baseline {baseline:.4f})")  # fmt: skip
    print(f"{'attention dropout':>18} {'median':>8} {'min':>8} {'max':>8}")
    for rate, values in accuracies.items():
        print(f"{rate:>18} {np.median(values):>8.4f} {min(values):>8.4f} {max(values):>8.4f}")
    result = {
        "steps": args.steps,
        "seeds": args.seeds,
        "baseline": baseline,
        "accuracy": accuracies,
        "median": {rate: float(np.median(v)) for rate, v in accuracies.items()},
    }
    if args.json:
        publish("attention_dropout", result)


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def attention_dropout_row(read: Read) -> tuple[str, str]:
    r = read("attention_dropout")["result"]
    return (
        f"attention dropout 0.1 vs none, CPU recipe, {r['steps']:,} steps (median of "
        f"{r['seeds']} seeds)",
        f"eval masked-LM accuracy {r['median']['0.1']:.4f} with vs {r['median']['0']:.4f} "
        f"without (baseline {r['baseline']:.4f}): the TPU presets drop it at 512 (splash)",
    )


ATTENTION_DROPOUT_COLUMNS: Columns = {
    "attention dropout": lambda r: r["rate"],
    "eval masked-LM accuracy, median": lambda r: f"{r['median']:.4f}",
    "min": lambda r: f"{min(r['seeds']):.4f}",
    "max": lambda r: f"{max(r['seeds']):.4f}",
}


def attention_dropout_block(read: Read) -> str:
    result = read("attention_dropout")["result"]
    rows = [
        {"rate": rate, "median": result["median"][rate], "seeds": seeds}
        for rate, seeds in result["accuracy"].items()
    ]
    return (
        f"{source('attention_dropout', read)}\n\nThe packed CPU recipe at step "
        f"{result['steps']}, {result['seeds']} seeds (most-frequent-token baseline "
        f"{result['baseline']:.4f}):\n\n{items_table(rows, ATTENTION_DROPOUT_COLUMNS)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"attention_dropout": attention_dropout_block}
README_ROW = (
    attention_dropout_row,
    "`python -m benchmarks.studies.attention_dropout --json` "
    "([results](docs/results.md#attention-dropout-at-512))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
