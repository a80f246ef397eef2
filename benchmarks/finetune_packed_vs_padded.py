"""Packed vs padded fine-tuning on the bundled sentiment set, side by side in one run.

  python benchmarks/finetune_packed_vs_padded.py --pretrained=workdir/demo/packed --json
  python benchmarks/finetune_packed_vs_padded.py --epochs=1 --seeds=1     # quicker

Each start point (`--pretrained`, a pre-training workdir such as the demo's, and a Hugging Face
checkpoint: `--hf`, or by default a randomly initialised one written here with `transformers`)
is fine-tuned by `bert_flax.finetune` (configs/finetune_sentiment.py: tiny BERT, rows of 128
tokens, AdamW, warm-up and linear decay) for the same epochs, with each seed, in three layouts:

  padded            one example per row, 32 rows per step;
  packed            up to 8 examples per row, `divide_accumulation`: about 32 examples (7 rows)
                    per step, as many steps as padded;
  packed_same_rows  32 packed rows per step (about 4.6x the examples, 4.6x fewer steps) with
                    `raise_betas` (b1, b2 to the power of the packing factor): the config's
                    default.

Reported per start point, medians over seeds: best validation accuracy of each layout and its
training throughput in examples per second (median over the log intervals after the first,
which holds the compilation; evaluation excluded). Those runs take minutes each, so on a shared
machine their throughputs see different load; the speed-up is therefore measured apart, side by
side: the three layouts' jitted train steps on real batches of the set, alternating every
--speed_steps steps for --speed_rounds rounds, median step time (`benchmarks/packed_vs_padded.py`
does the same for pre-training). The last line (`--json`) holds the packing factor, the first
start point's accuracies (`accuracy_packed`: the faster packed layout whose accuracy is within 1
point of padded) and the side-by-side `speedup` of that layout, and everything else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Sequence

from bert_flax import finetune, sharding
from bert_flax.metrics import read_metrics, side_by_side
from bert_flax.train_setup import create_train_setup
from configs import finetune_sentiment

# layout -> (packed, packing_hparams)
LAYOUTS = {
    "padded": (False, "none"),
    "packed": (True, "divide_accumulation"),
    "packed_same_rows": (True, "raise_betas"),
}


def layout_config(layout: str, seed: int = 0):
    config = finetune_sentiment.get_config()
    config.seed = seed
    config.data.packed, config.train.packing_hparams = LAYOUTS[layout]
    return config


def side_by_side_speed(rounds: int, steps: int) -> dict[str, float]:
    """Examples per second of each layout's train step, timed alternately on real batches."""
    setups, batches = {}, {}
    for layout in LAYOUTS:
        task = finetune.ClassificationTask(layout_config(layout))
        finetune.resolve_epochs(task.config, task)
        setups[layout] = setup = create_train_setup(task.config, task=task)
        iterator = task.train_batches(setup.batch_size, setup.model_config.vocab_size)
        batches[layout] = [sharding.global_batch(setup.mesh, next(iterator)) for _ in range(steps)]
    timings = side_by_side(setups, batches, rounds=rounds, steps=steps)
    return {layout: timing.sequences_per_second for layout, timing in timings.items()}


def run(init_from: str, layout: str, seed: int, epochs: float) -> dict:
    config = layout_config(layout, seed)
    config.init_from = init_from
    config.train.epochs = epochs
    config.log.plots = False
    config.checkpoint.enabled = False
    with tempfile.TemporaryDirectory() as workdir:
        final = finetune.finetune(config, workdir)
        train_records = read_metrics(workdir)["train"]
    rates = [r["sequences_per_second"] for r in train_records[1:]]
    return {
        "accuracy": final["best"]["value"],
        "examples_per_second": statistics.median(rates),
        "packing_factor": final["setup"]["packing_factor"],
        "rows_per_step": final["setup"]["rows_per_step"],
        "steps": final["step"],
        "baseline": final["baseline"],
    }


def random_hf_checkpoint(directory: str) -> str:
    """A randomly initialised Hugging Face BERT of the tiny preset's shapes."""
    import transformers

    from bert_flax import convert
    from bert_flax.config import BertConfig

    config = convert.config_to_hf(BertConfig.preset("tiny"))
    transformers.BertForPreTraining(transformers.BertConfig(**config)).save_pretrained(directory)
    return directory


def compare(init_from: str, seeds: int, epochs: float) -> dict:
    runs = {
        layout: [run(init_from, layout, seed, epochs) for seed in range(seeds)]
        for layout in LAYOUTS
    }

    def median(layout: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[layout]))

    result = {
        "init_from": init_from,
        "packing_factor": median("packed", "packing_factor"),
        "majority_baseline": runs["padded"][0]["baseline"],
    }
    for layout in LAYOUTS:
        result[f"accuracy_{layout}"] = median(layout, "accuracy")
        result[f"examples_per_second_{layout}"] = median(layout, "examples_per_second")
    for layout in ("packed", "packed_same_rows"):
        result[f"speedup_{layout}"] = (
            result[f"examples_per_second_{layout}"] / result["examples_per_second_padded"]
        )
    matching = [
        layout
        for layout in ("packed", "packed_same_rows")
        if result[f"accuracy_{layout}"] >= result["accuracy_padded"] - 0.01
    ]
    result.update(
        within_one_point=matching,
        rows_per_step={k: runs[k][0]["rows_per_step"] for k in runs},
        steps={k: runs[k][0]["steps"] for k in runs},
        runs=runs,
    )
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pretrained", default="", help="a pre-training workdir (the demo's)")
    parser.add_argument("--hf", default="", help="a Hugging Face BERT directory (tiny shapes)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hf_seeds", type=int, default=1, help="seeds from the HF checkpoint")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--speed_rounds", type=int, default=20)
    parser.add_argument("--speed_steps", type=int, default=5)
    parser.add_argument("--speed_only", action="store_true", help="only the side-by-side timing")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    speed = side_by_side_speed(args.speed_rounds, args.speed_steps)
    ratios = {k: speed[k] / speed["padded"] for k in LAYOUTS}
    print(
        f"side by side ({args.speed_rounds} rounds of {args.speed_steps} steps, median): "
        + ", ".join(f"{k} {v:.0f} examples/s ({ratios[k]:.2f}x)" for k, v in speed.items())
    )
    if args.speed_only:
        if args.json:
            print(json.dumps({"side_by_side_examples_per_second": speed, "speedup": ratios}))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        starts = [(args.pretrained, args.seeds)] if args.pretrained else []
        hf = args.hf or random_hf_checkpoint(os.path.join(tmp, "hf_random"))
        starts.append((hf, args.hf_seeds))
        for init_from, seeds in starts:
            result = compare(init_from, seeds, args.epochs)
            results.append(result)
            print(
                f"\nfrom {init_from}: {args.epochs:g} epochs, {seeds} seeds (medians); "
                f"packing factor {result['packing_factor']:.2f}, rows per step "
                f"{result['rows_per_step']}, steps {result['steps']}"
            )
            print("| layout | validation accuracy | examples/s | speedup (x packing factor) |")
            print("|---|---|---|---|")
            for layout in LAYOUTS:
                speedup = result.get(f"speedup_{layout}", 1.0)
                print(
                    f"| {layout} | {result[f'accuracy_{layout}']:.4f} "
                    f"| {result[f'examples_per_second_{layout}']:.0f} "
                    f"| {speedup:.2f} ({speedup / result['packing_factor']:.2f}) |"
                )
            print(f"majority-class baseline {result['majority_baseline']:.4f}")
    if args.json:
        first = results[0]
        best = max(first["within_one_point"] or ["packed"], key=ratios.get)
        summary = {
            "packing_factor": first["packing_factor"],
            "accuracy_packed": first[f"accuracy_{best}"],
            "accuracy_padded": first["accuracy_padded"],
            "speedup": ratios[best],
            "speedup_layout": best,
            "side_by_side_examples_per_second": speed,
            "side_by_side_speedup": ratios,
        }
        summary["results"] = [{k: v for k, v in r.items() if k != "runs"} for r in results]
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
