"""Packed vs padded SQuAD fine-tuning (the packing paper's comparison), side by side.

  python -m benchmarks.studies.squad_packed_vs_padded --json  # cloze set, 2 starts, 3 seeds
  python -m benchmarks.studies.squad_packed_vs_padded --seeds=1 --train_examples=500 --epochs=0.5
  python -m benchmarks.studies.squad_packed_vs_padded --pretrained=workdir/demo/packed

On the bundled cloze set (`bert_flax.tasks.squad.cloze`, SQuAD v1.1 format), configs/squad.py's
recipe (windows of 384 tokens, stride 128, up to 3 a row packed; AdamW, warm-up and linear
decay, 32 sequences a step: `divide_accumulation`, so packed takes 32 / p rows and the same
steps) fine-tunes the demo's recipe model (pre-LN, relative positions; its 8,192-word
vocabulary) from two starts: the demo's packed pre-training (`demo.pretrained_model`:
--pretrain_steps of the demo's recipe on the bundled speeches, reused when done; or
--pretrained=RUN) and random weights, each packed and padded, each with --seeds seeds. Per start
and layout: exact match and F1 of the best evaluation (an evaluation an epoch, medians over
seeds), against the baseline of answering with the context's first name or number.

Speed, timed side by side (alternating every --speed_steps steps for --speed_rounds rounds,
median sequences per second) before any training: the two layouts' train steps on the cloze
set's real rows, and on rows of SQuAD 1.1's window lengths at 384 (its bundled histogram,
`packing/data/squad_1_1_384.txt`; random tokens, --squad_windows windows sampled), each against
its packing factor. Targets: packed EM/F1 within 1 point of padded at each start, and a packed
step worth at least 0.9 x the packing factor x the padded one. The last line (`--json`) holds
`cloze` (per start and layout `exact_match`, `f1` and their runs, `steps`, `rows_per_step`),
`speed` (per data set `packing_factor`, `sequences_per_second`, `speedup`,
`speedup_over_packing_factor`), `max_f1_gap`, `max_exact_match_gap` and
`min_speedup_over_packing_factor`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence

import numpy as np

import packing
from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, source, times
from bert_flax import demo, sharding
from bert_flax.input_pipeline import rows as data_rows
from bert_flax.runs.pretrained import pretrained_vocab_file
from bert_flax.tasks import SquadTask
from bert_flax.tasks.squad.reading import Window
from bert_flax.tasks.squad.rows import WindowTable
from bert_flax.train import loop
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import side_by_side
from configs import squad

LAYOUTS = ("padded", "packed")
STARTS = demo.FINETUNE_STARTS  # ("pre-trained", "random")
SQUAD_HISTOGRAM = str(packing.histogram.SQUAD_1_1_384)


def squad_config(data_dir: str, layout: str, init_from: str, seed: int, args):
    """configs/squad.py's recipe for the demo's model in `data_dir`'s vocabulary."""
    config = squad.get_config("cpu")
    config.seed = seed
    config.model = demo.RECIPE.get_config().model
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1
    config.data.vocab_file = os.path.join(data_dir, "vocab.txt")
    config.data.packed = layout == "packed"
    config.data.train_examples = args.train_examples
    config.data.validation_examples = args.validation_examples
    config.train.packing_hparams = "divide_accumulation" if config.data.packed else "none"
    config.train.epochs = args.epochs or config.train.epochs
    config.init_from = init_from
    config.log.plots = False
    config.checkpoint.enabled = False
    return config


def synthetic_windows(lengths: np.ndarray, vocab_size: int, seed: int = 0) -> list[Window]:
    """Windows of `lengths` tokens with random ids: [CLS], a question of a quarter of the
    window, [SEP], a context, [SEP]; the answer somewhere in the context."""
    rng = np.random.default_rng(seed)
    windows = []
    for k, length in enumerate(lengths):
        question = max(1, int(length) // 4)
        ids = rng.integers(5, vocab_size, int(length), dtype=np.int32)
        types = (np.arange(length) > question + 1).astype(np.int32)
        spans = np.full((length, 2), -1, np.int32)
        context = np.arange(question + 2, length - 1)
        spans[context] = np.stack([context, context + 1], axis=1)
        start = int(rng.choice(context)) if len(context) else 0
        windows.append(Window(f"w{k}", ids, types, spans, start, start))
    return windows


def squad_case(tasks: dict, args) -> tuple[dict, dict, float]:
    """(setups, batches, packing factor) for rows of windows of SQuAD 1.1's lengths, random
    tokens: the padded recipe, and the packed one adjusted to these windows' factor."""
    histogram = packing.load_histogram(args.squad_histogram)
    max_len = len(histogram) - 1
    lengths = np.random.default_rng(0).choice(
        len(histogram), args.squad_windows, p=histogram / histogram.sum()
    )
    depth = tasks["packed"].depth
    factor = data_rows.packing_factor(data_rows.pack_examples(lengths, max_len, depth))
    setups = {
        "padded": create_train_setup(tasks["padded"].config, task=tasks["padded"]),
        "packed": create_train_setup(
            tasks["packed"].config, task=tasks["packed"], packing_factor_override=factor
        ),
    }
    table = WindowTable(synthetic_windows(lengths, setups["padded"].model_config.vocab_size))
    batches = {}
    for layout, setup in setups.items():
        rows = data_rows.batches(
            table,
            batch_size=setup.batch_size,
            max_seq_length=max_len,
            max_sequences_per_pack=setup.task.depth,
            packed=layout == "packed",
            shuffle=False,
        )
        batches[layout] = [sharding.global_batch(setup.mesh, b) for b in rows]
    return setups, batches, factor


def speed(data_dir: str, args) -> dict[str, dict]:
    """Sequences a second of both layouts' train steps, side by side, on the cloze set's rows
    and on SQuAD 1.1's window lengths."""
    tasks = {k: SquadTask(squad_config(data_dir, k, "", 0, args)) for k in LAYOUTS}
    setups, batches = {}, {}
    for layout, task in tasks.items():
        setups[layout] = create_train_setup(task.config, task=task)
        batches[layout] = setups[layout].first_train_batches(args.speed_steps)
    cases = {"cloze": (setups, batches, tasks["packed"].packing_factor())}
    if os.path.exists(args.squad_histogram):
        cases["squad_1_1_384"] = squad_case(tasks, args)
    else:
        print(f"skipping SQuAD 1.1: {args.squad_histogram} not found")
    result = {}
    for name, (case_setups, case_batches, factor) in cases.items():  # each setup timed once
        timings = side_by_side(
            case_setups, case_batches, rounds=args.speed_rounds, steps=args.speed_steps
        )
        rates = {k: t.sequences_per_second for k, t in timings.items()}
        ratio = rates["packed"] / rates["padded"]
        result[name] = {
            "packing_factor": factor,
            "rows_per_step": {k: s.batch_size for k, s in case_setups.items()},
            "sequences_per_second": rates,
            "speedup": ratio,
            "speedup_over_packing_factor": ratio / factor,
        }
        print(
            f"speed, {name}: packing factor {factor:.2f}, padded {rates['padded']:.1f} and "
            f"packed {rates['packed']:.1f} sequences/s: {ratio:.2f}x ({ratio / factor:.2f} of "
            "the factor)",
            flush=True,
        )
    return result


def fine_tune(data_dir: str, layout: str, init_from: str, seed: int, args) -> dict:
    config = squad_config(data_dir, layout, init_from, seed, args)
    with tempfile.TemporaryDirectory() as workdir:
        final = loop.train_and_evaluate(config, workdir)
    return {
        "f1": final["best"]["value"],
        "exact_match": final["best"]["eval"]["exact_match"],
        "steps": final["step"],
        "rows_per_step": final["setup"]["rows_per_step"],
        "packing_factor": final["setup"]["packing_factor"],
        "baseline_f1": final["baseline"],
    }


def median(runs: list[dict], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def accuracy(data_dir: str, pretrained: str, args) -> dict:
    result = {}
    for start in STARTS:
        init_from = pretrained if start == "pre-trained" else ""
        for layout in LAYOUTS:
            runs = [fine_tune(data_dir, layout, init_from, s, args) for s in range(args.seeds)]
            result[f"{start}/{layout}"] = entry = {
                "exact_match": median(runs, "exact_match"),
                "f1": median(runs, "f1"),
                "f1_runs": [r["f1"] for r in runs],
                "exact_match_runs": [r["exact_match"] for r in runs],
                "steps": runs[0]["steps"],
                "rows_per_step": runs[0]["rows_per_step"],
                "packing_factor": runs[0]["packing_factor"],
                "baseline_f1": runs[0]["baseline_f1"],
            }
            print(
                f"| {start} | {layout} | {entry['rows_per_step']} | {entry['steps']} | "
                f"{entry['exact_match']:.1f} | {entry['f1']:.1f} |",
                flush=True,
            )
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="workdir/bench/squad")
    parser.add_argument("--pretrained", default="", help="'': the demo's, trained here")
    parser.add_argument("--pretrain_steps", type=int, default=1600)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=0.0, help="0: the config's")
    parser.add_argument("--train_examples", type=int, default=0, help="0: every question")
    parser.add_argument("--validation_examples", type=int, default=0, help="0: every question")
    parser.add_argument("--squad_histogram", default=SQUAD_HISTOGRAM)
    parser.add_argument("--squad_windows", type=int, default=2048)
    parser.add_argument("--speed_rounds", type=int, default=12)
    parser.add_argument("--speed_steps", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    pretrained = args.pretrained or demo.pretrained_model(args.workdir, args.pretrain_steps)
    data_dir = os.path.dirname(pretrained_vocab_file(pretrained))
    speeds = speed(data_dir, args)  # first, while nothing else of this run is going on
    print(
        "| start | layout | rows per step | steps | exact match | F1 |\n|---|---|---|---|---|---|"
    )
    cloze = accuracy(data_dir, pretrained, args)
    gap = lambda key: max(cloze[f"{s}/padded"][key] - cloze[f"{s}/packed"][key] for s in STARTS)
    ratio = min(s["speedup_over_packing_factor"] for s in speeds.values())
    print(
        f"\npacked vs padded: largest F1 gap {gap('f1'):+.2f}, exact match "
        f"{gap('exact_match'):+.2f} (target <= 1); smallest speed-up / packing factor "
        f"{ratio:.2f} (target >= 0.9)"
    )
    if args.json:
        publish(
            "squad_packed_vs_padded",
            {
                "seeds": args.seeds,
                "pretrained": pretrained,
                "train_examples": args.train_examples,
                "cloze": cloze,
                "speed": speeds,
                "max_f1_gap": gap("f1"),
                "max_exact_match_gap": gap("exact_match"),
                "min_speedup_over_packing_factor": ratio,
            },
        )


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def squad_row(read: Read) -> tuple[str, str]:
    r = read("squad_packed_vs_padded")["result"]
    f1 = lambda start: "{} packed vs {} padded".format(
        *(f"{r['cloze'][f'{start}/{layout}']['f1']:.1f}" for layout in ("packed", "padded"))
    )
    speeds = ", ".join(
        f"{s['speedup']:.2f}x at {name} (packing factor {s['packing_factor']:.2f})"
        for name, s in r["speed"].items()
    )
    return (
        f"SQuAD-style QA fine-tuning packed vs padded, cloze set (median of {r['seeds']} seeds)",
        f"F1 from the demo's model {f1('pre-trained')}, from random weights {f1('random')}; "
        f"step speed-up {speeds}",
    )


SQUAD_COLUMNS: Columns = {
    "start": lambda s: s["start"],
    "layout": lambda s: s["layout"],
    "rows a step": lambda s: s["rows_per_step"],
    "steps": lambda s: s["steps"],
    "exact match": lambda s: f"{s['exact_match']:.1f}",
    "F1": lambda s: f"{s['f1']:.1f}",
    "F1 of each seed": lambda s: ", ".join(f"{f:.1f}" for f in s["f1_runs"]),
}


SQUAD_SPEED_COLUMNS: Columns = {
    "windows": lambda s: s["name"],
    "packing factor": lambda s: f"{s['packing_factor']:.2f}",
    "rows a step (padded / packed)": lambda s: "{padded} / {packed}".format(**s["rows_per_step"]),
    "sequences/s (padded / packed)": lambda s: "{padded:.1f} / {packed:.1f}".format(
        **s["sequences_per_second"]
    ),
    "step speed-up": lambda s: times(s["speedup"]),
    "of the packing factor": lambda s: f"{s['speedup_over_packing_factor']:.2f}",
}


def squad_block(read: Read) -> str:
    r = read("squad_packed_vs_padded")["result"]
    runs = [
        {"start": start, "layout": layout, **entry}
        for key, entry in r["cloze"].items()
        for start, layout in [key.split("/")]
    ]
    speeds = [{"name": name, **s} for name, s in r["speed"].items()]
    questions = f"{r['train_examples']:,} training questions" if r["train_examples"] else "all"
    return (
        f"{source('squad_packed_vs_padded', read)}\n\nThe cloze set ({questions}; the "
        f"evaluation on every dev question), best evaluation, median of {r['seeds']} seeds "
        f"(answering with the context's first name or number: F1 {runs[0]['baseline_f1']:.1f}; "
        f"packing factor of the training windows {runs[-1]['packing_factor']:.2f}):\n\n"
        f"{items_table(runs, SQUAD_COLUMNS)}\n\nTrain steps timed side by side:\n\n"
        f"{items_table(speeds, SQUAD_SPEED_COLUMNS)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"squad_packed_vs_padded": squad_block}
README_ROW = (
    squad_row,
    "`python -m benchmarks.studies.squad_packed_vs_padded --train_examples=3000 --json` "
    "([results](docs/results.md#question-answering))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
