r"""Does BERT need attention-probability dropout? The CPU recipe with and without it, equal steps.

    python benchmarks/attention_dropout.py --json      # 2 rates x 3 seeds x 1,000 steps: ~30 min

Splash attention (the TPU kernel the compile table predicts fastest at 512) has no dropout on
the attention probabilities; MosaicBERT and Cramming pre-train without it. This trains the CPU
recipe (`configs/cpu_pretrain.py`, packed, on its bundled data prepared once in --workdir) at
each --rates value of `model.attention_dropout_rate` for the same --steps and seeds (the learning
rate held at its peak after the warm-up, as in `make demo`), and reports the final eval
masked-LM accuracy per rate: median, min and max over seeds, against the most-frequent-token
baseline (a comparison on the unigram plateau would say nothing). Finished runs of the same
config, data and code are reused (`loop.reusable_run`).

With --json the last line is a JSON object: per rate the seeds' accuracies and their median,
the baseline and the steps (benchmarks/results/attention_dropout.json).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from results import publish

from bert_flax import demo
from bert_flax.train import loop
from configs import cpu_pretrain

METRIC = "masked_lm_accuracy"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="workdir/bench/attention_dropout")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.1, 0.0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument(
        "--dupe_factor",
        type=int,
        default=cpu_pretrain.PREPARE["dupe_factor"],
        help="Maskings of each document in the prepared data (the recipe's by default).",
    )
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    return parser.parse_args()


def run(args, data_dir: str, rate: float, seed: int) -> dict:
    config = demo.pretraining_config(data_dir, True, 0.0, args.steps, seed, recipe=cpu_pretrain)
    config.model.attention_dropout_rate = rate
    workdir = os.path.join(args.workdir, f"rate{rate:g}_seed{seed}")
    final = loop.reusable_run(workdir, config) or loop.train_and_evaluate(config, workdir)
    loop.exit_if_preempted(final)
    return final


def main() -> None:
    args = parse_args()
    data_dir = os.path.join(args.workdir, "sotu_cpu")
    demo.prepare_data(data_dir, dupe_factor=args.dupe_factor)
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


if __name__ == "__main__":
    main()
