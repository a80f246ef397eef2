"""Packed vs padded fine-tuning on the bundled sentiment set, side by side in one run.

  python benchmarks/finetune_packed_vs_padded.py --pretrained=workdir/demo/packed --json
  python benchmarks/finetune_packed_vs_padded.py --epochs=1 --seeds=1     # quicker

Each start point (`--pretrained`, a pre-training workdir such as the demo's, and a Hugging Face
checkpoint: `--hf`, or by default a randomly initialised one written here with `transformers`)
is fine-tuned by `bert_flax.finetune` (configs/finetune_sentiment.py: tiny BERT, rows of 128
tokens, AdamW, warm-up and linear decay) for the same epochs, with each seed, in three layouts:

  padded            one example per row, 32 rows per step;
  packed            up to 8 examples per row, `divide_accumulation`: about 32 examples (7 rows)
                    per step, as many steps as padded (the config's default);
  packed_same_rows  32 packed rows per step (about 4.6x the examples, 4.6x fewer steps) with
                    `raise_betas` (b1, b2 to the power of the packing factor).

Reported per start point, medians over seeds: best validation accuracy of each layout, training
throughput in examples per second (median over the log intervals after the first, which holds
the compilation; evaluation excluded), each packed layout's ratio to padded, and the packing
factor. The last line (`--json`) holds the first start point's figures (`speedup`: the better
packed layout whose accuracy is within 1 point of padded) and all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Sequence

from bert_flax import finetune
from bert_flax.metrics import read_metrics
from configs import finetune_sentiment

# layout -> (packed, packing_hparams)
LAYOUTS = {
    "padded": (False, "none"),
    "packed": (True, "divide_accumulation"),
    "packed_same_rows": (True, "raise_betas"),
}


def run(init_from: str, layout: str, seed: int, epochs: float) -> dict:
    config = finetune_sentiment.get_config()
    config.seed = seed
    config.init_from = init_from
    config.data.packed, config.train.packing_hparams = LAYOUTS[layout]
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
    best = max(matching or ["packed"], key=lambda k: result[f"speedup_{k}"])
    result.update(
        speedup=result[f"speedup_{best}"],
        speedup_layout=best,
        accuracy_packed_best=result[f"accuracy_{best}"],
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
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
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
        summary = {
            "packing_factor": first["packing_factor"],
            "accuracy_packed": first["accuracy_packed_best"],
            "accuracy_padded": first["accuracy_padded"],
            "speedup": first["speedup"],
            "speedup_layout": first["speedup_layout"],
        }
        summary["results"] = [{k: v for k, v in r.items() if k != "runs"} for r in results]
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
