"""Packed vs padded fine-tuning at packing factors of about 2, 4.6 and 8, side by side.

  python -m benchmarks.studies.finetune_packed_vs_padded --json  # the three sets, 3 seeds
  python -m benchmarks.studies.finetune_packed_vs_padded --sets= --train_file=train.tsv  # your data
  python -m benchmarks.studies.finetune_packed_vs_padded --sets=first_words --seeds=1 --epochs=0.1

Each set is fine-tuned by `bert_flax.train` at configs/finetune_sentiment.py's settings (tiny
BERT, rows of 128 tokens, AdamW, warm-up and linear decay, its epochs) once padded (one example
per row, 32 rows a step) and once packed at the config's `packing_hparams`
("divide_accumulation", `min_rows_per_step` 8), with each seed. Packed, a step takes
round(32 / p) rows, which keeps the padded run's examples per step, steps, betas and learning
rate, while that is at least 8 rows (p up to about 4: "pairs"); beyond, it takes 8 rows: about
8p / 32 times the examples per step and as many times fewer steps (1.16 for "bundled", 2 for
"first_words"), with b1**r, b2**r and the learning rate times sqrt(r), r = 8 / round(32 / p).
The sets, built from the bundled Rotten Tomatoes reviews so that they pack at different factors
(split 0.8/0.1/0.1 by the config's split_seed):

  pairs        two reviews of the same label joined as one text: about 2 per row;
  bundled      the reviews as they are: about 4.6;
  first_words  each review cut to its first 6 words: about 8 (the config's cap per row);

and `--train_file` (with `--validation_file`, optional) adds a file of your own as set "file".

Per set: best validation accuracy packed and padded (medians over seeds), and the speed-up: the
two layouts' jitted train steps on real batches of the set, alternating every --speed_steps
steps for --speed_rounds rounds, median examples per second (the training runs take minutes
each and see different load, so their own throughputs are not compared). Targets: packed within
1 point of padded and a speed-up of at least 0.8 x the packing factor, at every set. The last
line (`--json`) holds per set `packing_factor`, `accuracy_packed`, `accuracy_padded`, `speedup`
(`speedups` per layout), and `max_accuracy_gap`, `min_speedup_over_packing_factor` over sets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence

import numpy as np

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, source, times
from bert_flax import tasks
from bert_flax.tasks.classification import data as classification
from bert_flax.tasks.classification import reading as classification_reading
from bert_flax.train import loop
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import side_by_side
from configs import finetune_sentiment

# layout -> (packed, packing_hparams); "packed" keeps the config's default adaptation.
LAYOUTS = {
    "padded": (False, "none"),
    "packed": (True, finetune_sentiment.get_config().train.packing_hparams),
    "packed_same_rows": (True, "raise_betas"),
}
FIRST_WORDS = 6


def _bundled_reviews() -> classification.LabelledSplit:
    splits = classification_reading.rotten_tomatoes().splits
    whole = [splits[name] for name in classification.SPLIT_NAMES if name in splits]
    return classification.LabelledSplit(
        texts=[t for s in whole for t in s.texts],
        texts_b=None,
        labels=np.concatenate([s.labels for s in whole]),
        ids=np.concatenate([s.ids for s in whole]),
    )


def _pairs(texts: list[str], labels: np.ndarray) -> tuple[list[str], list[int]]:
    """Consecutive reviews of the same label, two by two, joined as one text."""
    out_texts, out_labels = [], []
    for label in np.unique(labels):
        same = [texts[i] for i in np.flatnonzero(labels == label)]
        out_texts += [f"{a} {b}" for a, b in zip(same[::2], same[1::2])]
        out_labels += [int(label)] * (len(same) // 2)
    return out_texts, out_labels


SET_BUILDERS: dict[str, Callable[[list[str], np.ndarray], tuple[list[str], list[int]]]] = {
    "pairs": _pairs,
    "bundled": lambda texts, labels: (texts, labels.tolist()),
    "first_words": lambda texts, labels: (
        [" ".join(t.split()[:FIRST_WORDS]) for t in texts],
        labels.tolist(),
    ),
}


def write_set(name: str, directory: str) -> str:
    """The set `name` of SET_BUILDERS as a JSONL file (text, label) in `directory`."""
    reviews = _bundled_reviews()
    texts, labels = SET_BUILDERS[name](reviews.texts, reviews.labels)
    path = os.path.join(directory, f"{name}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for text, label in zip(texts, labels):
            f.write(json.dumps({"text": text, "label": label}) + "\n")
    return path


def layout_config(layout: str, train_file: str, validation_file: str = "", seed: int = 0):
    config = finetune_sentiment.get_config()
    config.seed = seed
    config.data.train_file, config.data.validation_file = train_file, validation_file
    config.data.packed, config.train.packing_hparams = LAYOUTS[layout]
    return config


def side_by_side_speed(
    files: tuple[str, str], layouts: Sequence[str], rounds: int, steps: int
) -> dict[str, float]:
    """Examples per second of each layout's train step, timed alternately on real batches."""
    setups, batches = {}, {}
    for layout in layouts:
        task = tasks.ClassificationTask(layout_config(layout, *files))
        setups[layout] = setup = create_train_setup(task.config, task=task)
        batches[layout] = setup.first_train_batches(steps)
    timings = side_by_side(setups, batches, rounds=rounds, steps=steps)
    return {layout: timing.sequences_per_second for layout, timing in timings.items()}


def run(files: tuple[str, str], layout: str, seed: int, init_from: str, epochs: float) -> dict:
    config = layout_config(layout, *files, seed=seed)
    config.init_from = init_from
    config.train.epochs = epochs or config.train.epochs
    config.log.plots = False
    config.checkpoint.enabled = False
    with tempfile.TemporaryDirectory() as workdir:
        final = loop.train_and_evaluate(config, workdir)
    return {
        "accuracy": final["best"]["value"],
        "packing_factor": final["setup"]["packing_factor"],
        "rows_per_step": final["setup"]["rows_per_step"],
        "steps": final["step"],
        "baseline": final["baseline"],
    }


def compare(
    files: tuple[str, str], layouts: Sequence[str], seeds: int, init_from: str, epochs: float
) -> dict:
    runs = {
        layout: [run(files, layout, s, init_from, epochs) for s in range(seeds)]
        for layout in layouts
    }

    def median(layout: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[layout]))

    result = {
        "packing_factor": median("packed", "packing_factor"),
        "majority_baseline": runs["padded"][0]["baseline"],
        "rows_per_step": {k: runs[k][0]["rows_per_step"] for k in layouts},
        "steps": {k: runs[k][0]["steps"] for k in layouts},
        "accuracy_runs": {k: [r["accuracy"] for r in runs[k]] for k in layouts},
    }
    for layout in layouts:
        result[f"accuracy_{layout}"] = median(layout, "accuracy")
    return result


def report(name: str, result: dict, layouts: Sequence[str]) -> None:
    p = result["packing_factor"]
    print(
        f"\n{name}: packing factor {p:.2f}, majority class {result['majority_baseline']:.4f}; "
        f"{len(result['accuracy_runs']['padded'])} seeds (medians)"
    )
    print("| layout | rows per step | steps | validation accuracy | examples/s | speed-up (x p) |")
    print("|---|---|---|---|---|---|")
    for layout in layouts:
        ratio = result["speedups"][layout]
        print(
            f"| {layout} | {result['rows_per_step'][layout]} | {result['steps'][layout]} "
            f"| {result[f'accuracy_{layout}']:.4f} "
            f"| {result['examples_per_second'][layout]:.0f} | {ratio:.2f}x ({ratio / p:.2f}) |",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default=",".join(SET_BUILDERS), help="of " + str(SET_BUILDERS))
    parser.add_argument("--train_file", default="", help="your own labelled CSV/TSV/JSONL")
    parser.add_argument("--validation_file", default="", help="'': split from --train_file")
    parser.add_argument("--layouts", default="padded,packed", help="of " + str(list(LAYOUTS)))
    parser.add_argument(
        "--init_from", default="", help="a checkpoint of the config's model; '': random"
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=0.0, help="0: the config's")
    parser.add_argument("--speed_rounds", type=int, default=20)
    parser.add_argument("--speed_steps", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    layouts = [k for k in args.layouts.split(",") if k]
    if "padded" not in layouts or "packed" not in layouts or set(layouts) - set(LAYOUTS):
        parser.error(f"--layouts must include padded and packed, of {list(LAYOUTS)}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: (write_set(name, tmp), "") for name in args.sets.split(",") if name}
        if args.train_file:
            files["file"] = (args.train_file, args.validation_file)
        # All timings first, while nothing else of this run is going on.
        speeds = {
            name: side_by_side_speed(set_files, layouts, args.speed_rounds, args.speed_steps)
            for name, set_files in files.items()
        }
        for name, set_files in files.items():
            result = compare(set_files, layouts, args.seeds, args.init_from, args.epochs)
            result["examples_per_second"] = speeds[name]
            result["speedups"] = {k: speeds[name][k] / speeds[name]["padded"] for k in layouts}
            results[name] = result
            report(name, result, layouts)
    gaps = {k: r["accuracy_padded"] - r["accuracy_packed"] for k, r in results.items()}
    ratios = {k: r["speedups"]["packed"] / r["packing_factor"] for k, r in results.items()}
    print(
        f"\npacked vs padded: largest accuracy gap {max(gaps.values()):+.4f} (target <= 0.01); "
        f"smallest speed-up / packing factor {min(ratios.values()):.2f} (target >= 0.8)"
    )
    if args.json:
        summary = {name: {**r, "speedup": r["speedups"]["packed"]} for name, r in results.items()}
        publish(
            "finetune_packed_vs_padded",
            {
                "seeds": args.seeds,
                "sets": summary,
                "max_accuracy_gap": max(gaps.values()),
                "min_speedup_over_packing_factor": min(ratios.values()),
            },
        )


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def finetune_row(read: Read) -> tuple[str, str]:
    r = read("finetune_packed_vs_padded")["result"]
    sets = r["sets"].values()
    each = lambda key, fmt: " / ".join(format(s[key], fmt) for s in sets)
    times = " / ".join(f"{s['speedup']:.2f}x" for s in sets)
    over = " / ".join(f"{s['speedup'] / s['packing_factor']:.2f}" for s in sets)
    return (
        f"fine-tuning packed vs padded at packing factors {each('packing_factor', '.2f')} "
        f"(median of {r['seeds']} seeds)",
        f"validation accuracy packed {each('accuracy_packed', '.4f')} vs padded "
        f"{each('accuracy_padded', '.4f')}; step speed-up {times} "
        f"({over} of the packing factor)",
    )


FINETUNE_COLUMNS: Columns = {
    "set": lambda s: s["name"],
    "packing factor": lambda s: s["packing_factor"],
    "rows a step (padded / packed)": lambda s: "{padded} / {packed}".format(**s["rows_per_step"]),
    "steps": lambda s: "{padded} / {packed}".format(**s["steps"]) if "steps" in s else "-",
    "padded accuracy": lambda s: s["accuracy_padded"],
    "packed accuracy": lambda s: s["accuracy_packed"],
    "step speed-up": lambda s: times(s["speedup"]),
    "of the packing factor": lambda s: f"{s['speedup'] / s['packing_factor']:.2f}",
}


def finetune_block(read: Read) -> str:
    r = read("finetune_packed_vs_padded")["result"]
    sets = [{"name": name, **s} for name, s in r["sets"].items()]
    return (
        f"{source('finetune_packed_vs_padded', read)}\n\nValidation accuracy, median of "
        f"{r['seeds']} seeds:\n\n{items_table(sets, FINETUNE_COLUMNS)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"finetune_packed_vs_padded": finetune_block}
README_ROW = (
    finetune_row,
    "`python -m benchmarks.studies.finetune_packed_vs_padded --json` "
    "([results](docs/results.md#fine-tuning))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
