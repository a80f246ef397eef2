"""Packed vs padded fine-tuning on every kind of task, side by side: single texts, sentence
pairs, multi-label, token classification and question answering.

  python -m benchmarks.studies.finetune_suite --seeds=3 --train_examples=2000 --json  # published
  python -m benchmarks.studies.finetune_suite --kinds=pair,token --seeds=1 --train_examples=500

Each kind is a task on data that installs offline, labelled by a rule a model can learn or by
people (`KINDS`): the bundled Rotten Tomatoes reviews (`sentence`), sentence pairs of the bundled
speeches that do or do not mention a common name or number (`pair`,
`bert_flax.tasks.classification.pairs`), the reviews' rule tags (`multi_label`), the speeches'
rule-tagged names, dates and numbers (`token`), and the speeches' cloze questions (`qa`). Each is
fine-tuned by `bert_flax.train` at its config's recipe for the demo's recipe model (its
vocabulary) from two starts, the demo's packed pre-training (`demo.pretrained_model`, reused when
done; or --pretrained=RUN) and random weights, padded and packed (`divide_accumulation`: the
padded recipe's examples a step), --seeds seeds each. Per kind, start and layout: every metric of
the best evaluation, medians over seeds, the main one's per seed.

Speed, timed before any training, side by side (alternating every --speed_steps steps for
--speed_rounds rounds, median sequences a second): each kind's train step on 32 rows of its
training data, padded (32 sequences) and packed (32 rows of about p sequences each), against its
packing factor p. Targets: packed within the seeds' spread of padded on every main metric, and a
packed step worth at least 0.9 p padded ones. The last line (`--json`) holds per kind `metric`,
`runs` (per "start/layout": `median`, `per_seed`, `metrics`, `steps`, `rows_per_step`,
`packing_factor`, `baseline`), `speed` and `gaps`; and `max_gap_beyond_spread` (the largest
|padded - packed| less the seeds' spread: <= 0 when within it), `min_speedup_over_packing_factor`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence

import ml_collections

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, source, times
from bert_flax import demo
from bert_flax.runs.pretrained import pretrained_vocab_file
from bert_flax.tasks import TASKS, task_class
from bert_flax.tasks.classification import pairs
from bert_flax.train import loop
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import side_by_side
from configs import finetune_sentiment, multi_label, squad

LAYOUTS = ("padded", "packed")
STARTS = demo.FINETUNE_STARTS  # ("pre-trained", "random")
SPEED_ROWS = 32


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of task: its config (given a folder for files it writes) and main metric."""

    config: Callable[[str], ml_collections.ConfigDict]
    metric: str
    data: str  # what it trains on, for the docs


@functools.cache
def _pair_files(folder: str) -> str:
    out = os.path.join(folder, "pairs")
    pairs.write_sets(out)
    return out


def _pair_config(folder: str) -> ml_collections.ConfigDict:
    config = finetune_sentiment.get_config()
    out = _pair_files(folder)
    for field, name in (("train_file", "train"), ("validation_file", "dev"), ("test_file", "test")):
        config.data[field] = os.path.join(out, f"{name}.tsv")
    return config


def _token_config(folder: str) -> ml_collections.ConfigDict:
    from configs import conll

    return conll.get_config()


KINDS = {
    "sentence": Kind(lambda _: finetune_sentiment.get_config(), "accuracy", "the reviews"),
    "pair": Kind(_pair_config, "accuracy", "speech sentence pairs: a common mention?"),
    "multi_label": Kind(lambda _: multi_label.get_config(), "micro_f1", "the reviews' tags"),
    "token": Kind(_token_config, "entity_f1", "speech names, dates and numbers by rule"),
    "qa": Kind(lambda _: squad.get_config("cpu"), "f1", "speech cloze questions"),
}


def recipe(kind: str, layout: str, init_from: str, seed: int, args) -> ml_collections.ConfigDict:
    """`kind`'s config for the demo's recipe model in its vocabulary, `layout` and start."""
    config = KINDS[kind].config(args.workdir)
    config.seed = seed
    config.model = demo.RECIPE.get_config().model
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1
    config.data.vocab_file = os.path.join(args.data_dir, "vocab.txt")
    config.data.packed = layout == "packed"
    if not config.data.packed:
        config.train.packing_hparams = "none"
    if args.train_examples:
        config.data.train_examples = args.train_examples
    if args.epochs:
        config.train.epochs = args.epochs
    # As the demo fine-tunes its model (demo.finetuning_config); read by the classifier tasks.
    config.classifier.update(pooling="mean", rescale_embeddings=True)
    config.init_from = init_from
    config.log.plots = False
    config.checkpoint.enabled = False
    return config


def speed(kind: str, args) -> dict:
    """Sequences a second of the two layouts' train steps on `SPEED_ROWS` rows of `kind`."""
    setups, batches, factor = {}, {}, 1.0
    for layout in LAYOUTS:
        config = recipe(kind, layout, "", 0, args)
        config.train.update(packing_hparams="none", batch_size=SPEED_ROWS, min_rows_per_step=1)
        config.data.train_examples = 0  # rows of the whole train split
        task = task_class(config.task)(config)
        factor = max(factor, task.packing_factor())
        setups[layout] = create_train_setup(config, task=task)
        batches[layout] = setups[layout].first_train_batches(args.speed_steps)
    timings = side_by_side(setups, batches, rounds=args.speed_rounds, steps=args.speed_steps)
    rates = {k: t.sequences_per_second for k, t in timings.items()}
    ratio = rates["packed"] / rates["padded"]
    print(
        f"speed, {kind}: packing factor {factor:.2f}, padded {rates['padded']:.1f} and packed "
        f"{rates['packed']:.1f} sequences/s: {ratio:.2f}x ({ratio / factor:.2f} of the factor)",
        flush=True,
    )
    return {
        "packing_factor": factor,
        "sequences_per_second": rates,
        "speedup": ratio,
        "speedup_over_packing_factor": ratio / factor,
    }


def fine_tune(kind: str, layout: str, init_from: str, seed: int, args) -> dict:
    config = recipe(kind, layout, init_from, seed, args)
    with tempfile.TemporaryDirectory() as workdir:
        final = loop.train_and_evaluate(config, workdir)
    if final["best"]["metric"] != KINDS[kind].metric:
        raise ValueError(f"{kind} judged by {final['best']['metric']}, not {KINDS[kind].metric}.")
    return {
        "value": final["best"]["value"],
        "metrics": {k: v for k, v in final["best"]["eval"].items() if isinstance(v, float)},
        "steps": final["step"],
        "rows_per_step": final["setup"]["rows_per_step"],
        "packing_factor": final["setup"]["packing_factor"],
        "baseline": final["baseline"],
    }


def runs_of(kind: str, args) -> dict[str, dict]:
    """Per "start/layout": medians over seeds of every metric of the best evaluation."""
    result = {}
    for start in STARTS:
        init_from = args.pretrained if start == "pre-trained" else ""
        for layout in LAYOUTS:
            runs = [fine_tune(kind, layout, init_from, s, args) for s in range(args.seeds)]
            metrics = {
                name: float(statistics.median(r["metrics"][name] for r in runs))
                for name in runs[0]["metrics"]
            }
            result[f"{start}/{layout}"] = entry = {
                "median": float(statistics.median(r["value"] for r in runs)),
                "per_seed": [r["value"] for r in runs],
                "metrics": metrics,
                **{k: runs[0][k] for k in ("steps", "rows_per_step", "packing_factor", "baseline")},
            }
            print(
                f"| {kind} | {start} | {layout} | {entry['steps']} | {KINDS[kind].metric} "
                f"{entry['median']:.4f} | {entry['per_seed']} |",
                flush=True,
            )
    return result


def gaps(runs: dict[str, dict]) -> dict[str, dict]:
    """Per start: padded minus packed on the main metric, and the seeds' spread (the larger of
    the two layouts' max - min)."""
    found = {}
    for start in STARTS:
        padded, packed = runs[f"{start}/padded"], runs[f"{start}/packed"]
        spread = max(max(r["per_seed"]) - min(r["per_seed"]) for r in (padded, packed))
        found[start] = {"gap": padded["median"] - packed["median"], "spread": spread}
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="workdir/bench/suite")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {sorted(KINDS)}")
    parser.add_argument("--pretrained", default="", help="'': the demo's, trained here")
    parser.add_argument("--pretrain_steps", type=int, default=1600)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=0.0, help="0: each config's")
    parser.add_argument(
        "--train_examples", type=int, default=0, help="0: all (token: sentences; qa: questions)"
    )
    parser.add_argument("--speed_rounds", type=int, default=8)
    parser.add_argument("--speed_steps", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; choose of {sorted(KINDS)}")
    if "token" in kinds and "token_classification" not in TASKS:
        parser.error("--kinds=token needs the token_classification task")
    os.makedirs(args.workdir, exist_ok=True)
    args.pretrained = args.pretrained or demo.pretrained_model(args.workdir, args.pretrain_steps)
    args.data_dir = os.path.dirname(pretrained_vocab_file(args.pretrained))
    speeds = {kind: speed(kind, args) for kind in kinds}  # first, while nothing else runs
    print("| kind | start | layout | steps | best | per seed |\n|---|---|---|---|---|---|")
    result = {}
    for kind in kinds:
        runs = runs_of(kind, args)
        result[kind] = {
            "metric": KINDS[kind].metric,
            "data": KINDS[kind].data,
            "runs": runs,
            "speed": speeds[kind],
            "gaps": gaps(runs),
        }
    # How far the largest packed-padded gap lies outside the seeds' spread (<= 0: within it).
    worst_gap = max(
        abs(g["gap"]) - g["spread"] for r in result.values() for g in r["gaps"].values()
    )
    ratio = min(s["speedup_over_packing_factor"] for s in speeds.values())
    print(
        f"\npacked vs padded: largest gap beyond the seeds' spread {worst_gap:+.4f} (target <= 0); "
        f"smallest speed-up / packing factor {ratio:.2f} (target >= 0.9)"
    )
    if args.json:
        publish(
            "finetune_suite",
            {
                "seeds": args.seeds,
                "pretrained": args.pretrained,
                "train_examples": args.train_examples,
                "kinds": result,
                "max_gap_beyond_spread": worst_gap,
                "min_speedup_over_packing_factor": ratio,
            },
        )


# Its blocks in the docs, rendered from its results file (`python -m benchmarks --docs`).


def suite_row(read: Read) -> tuple[str, str]:
    r = read("finetune_suite")["result"]
    kinds = "; ".join(
        f"{kind} {k['metric']} {k['runs']['pre-trained/packed']['median']:.3f} packed vs "
        f"{k['runs']['pre-trained/padded']['median']:.3f} padded, "
        f"{k['speed']['speedup_over_packing_factor']:.2f} of p"
        for kind, k in r["kinds"].items()
    )
    return (
        f"fine-tuning suite packed vs padded, every kind of task (median of {r['seeds']} seeds, "
        "from the demo's model; step speed-up over the packing factor p)",
        kinds,
    )


SUITE_COLUMNS: Columns = {
    "kind": lambda s: s["kind"],
    "start": lambda s: s["start"],
    "metric": lambda s: s["metric"],
    "padded": lambda s: f"{s['padded']['median']:.4f}",
    "packed": lambda s: f"{s['packed']['median']:.4f}",
    "gap (padded - packed)": lambda s: f"{s['gap']:+.4f}",
    "seeds' spread": lambda s: f"{s['spread']:.4f}",
    "baseline": lambda s: f"{s['packed']['baseline']:.4f}",
    "its other metrics (padded / packed)": lambda s: other_metrics(s),
    "steps (padded / packed)": lambda s: f"{s['padded']['steps']} / {s['packed']['steps']}",
}


# What an evaluation summary holds besides the task's metrics.
BOOKKEEPING = (
    "real_tokens", "rows", "sequences", "tokens", "padding_fraction", "sequences_per_row",
    "eval_batches", "baseline", "complete", "threshold",
)  # fmt: skip


def shown(name: str, main: str) -> bool:
    """Whether the block lists metric `name` beside the main one: not a loss, not bookkeeping,
    and of an entity type its F1 only."""
    per_type = name.endswith(("_precision", "_recall")) and not name.startswith("entity_")
    return name != main and not name.endswith("loss") and name not in BOOKKEEPING and not per_type


def other_metrics(row: dict) -> str:
    """The best evaluation's other metrics (`shown`), padded / packed medians."""
    padded, packed = row["padded"]["metrics"], row["packed"]["metrics"]
    names = [n for n in padded if n in packed and shown(n, row["metric"])]
    return ", ".join(f"{n} {padded[n]:.4f} / {packed[n]:.4f}" for n in names) or "-"


SPEED_COLUMNS: Columns = {
    "kind": lambda s: s["kind"],
    "packing factor": lambda s: f"{s['packing_factor']:.2f}",
    "sequences/s (padded / packed)": lambda s: "{padded:.1f} / {packed:.1f}".format(
        **s["sequences_per_second"]
    ),
    "step speed-up": lambda s: times(s["speedup"]),
    "of the packing factor": lambda s: f"{s['speedup_over_packing_factor']:.2f}",
}


def suite_block(read: Read) -> str:
    r = read("finetune_suite")["result"]
    rows = [
        {
            "kind": kind,
            "start": start,
            "metric": k["metric"],
            "padded": k["runs"][f"{start}/padded"],
            "packed": k["runs"][f"{start}/packed"],
            **k["gaps"][start],
        }
        for kind, k in r["kinds"].items()
        for start in STARTS
    ]
    speeds = [{"kind": kind, **k["speed"]} for kind, k in r["kinds"].items()]
    return (
        f"{source('finetune_suite', read)}\n\nBest evaluation, median of {r['seeds']} seeds:\n\n"
        f"{items_table(rows, SUITE_COLUMNS)}\n\nTrain steps on {SPEED_ROWS} rows, timed side by "
        f"side:\n\n{items_table(speeds, SPEED_COLUMNS)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"finetune_suite": suite_block}
README_ROW = (
    suite_row,
    "`python -m benchmarks.studies.finetune_suite --seeds=3 --train_examples=2000 --json` "
    "([results](docs/results.md#the-fine-tuning-suite))",
)


if __name__ == "__main__":
    main()
