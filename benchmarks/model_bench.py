"""Packed vs padded BERT steps: time, sequences/s, and XLA FLOPs against the machine's matmul rate.

    python -m benchmarks.model_bench                       # tiny and base, L = 128 and 512
    python -m benchmarks.model_bench --models=tiny --lengths=128 --repeats=5 --json

Both layouts use the same number of rows of the same length: a padded row holds one sequence
(about half full), a packed row two (~80% full, three slots), so the compute per step is nearly
the same (a few more MLM prediction slots) and the packed step processes twice the sequences.
"fwd" is the evaluation forward pass; "fwd+bwd" the loss gradient with dropout (a train step
without the optimizer update). The four calls of a shape (padded and packed, fwd and fwd+bwd)
take turns in each of --repeats rounds, each figure the median of its rounds.
Utilisation = (XLA cost-analysis FLOPs / step time) / (measured dense float32 matmul FLOP/s).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, source, times, whole
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.synthetic import batch_from_lengths
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig
from bert_flax.model.losses import pretraining_loss
from bert_flax.train.timing import in_turns

MASKED_FRACTION = 0.15


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny,base", help="BertConfig presets.")
    parser.add_argument("--lengths", default="128,512", help="Row lengths.")
    parser.add_argument(
        "--batch", default="tiny:8,base:1", help="Rows per batch per preset (preset:rows,...)."
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="Rounds of timed calls, the layouts in turns."
    )
    parser.add_argument(
        "--matmul_size", type=int, default=1024, help="Square float32 matmul for the peak rate."
    )
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    return parser.parse_args()


def synthetic_batch(rng, rows: int, length: int, per_row: int, slots: int) -> dict[str, np.ndarray]:
    """Rows of `per_row` random sequences: one fills ~50% of a row, two ~80%.

    Prediction slots: 15% of the row (BERT's max_predictions_per_seq) for padded rows; for packed
    rows the same plus one per slot (each sequence masks round(15%) of its tokens).
    """
    low, high = (0.3, 0.7) if per_row == 1 else (0.3, 0.5)
    lengths = rng.integers(int(low * length), int(high * length) + 1, size=(rows, per_row))
    predictions = round(MASKED_FRACTION * length) + (slots if per_row > 1 else 0)
    shape = RowShape(length, slots, predictions)
    return batch_from_lengths(lengths.tolist(), shape, seed=int(rng.integers(1 << 30)))


def compiled(fn: Callable, args: tuple) -> tuple[Callable[[], object], float]:
    """A call of jitted `fn` on `args` (compiled and warmed up), and its XLA FLOPs."""
    executable = jax.jit(fn).lower(*args).compile()
    cost = executable.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    call = lambda: jax.block_until_ready(executable(*args))
    call()  # warm-up
    return call, float(cost.get("flops", float("nan")))


def matmul_rate(size: int, repeats: int) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size)), jnp.float32)
    call, _ = compiled(lambda x, y: x @ y, (a, a))
    return 2.0 * size**3 / in_turns({"matmul": call}, max(repeats, 5))["matmul"]


def bench_one(preset: str, length: int, rows: int, repeats: int, peak: float) -> list[dict]:
    config = BertConfig.preset(preset, max_position_embeddings=max(512, length))
    model = BertForPreTraining(config)
    rng = np.random.default_rng(0)
    layouts = {
        "padded": synthetic_batch(rng, rows, length, per_row=1, slots=1),
        "packed": synthetic_batch(rng, rows, length, per_row=2, slots=3),
    }
    params = jax.jit(lambda b: model.init(jax.random.key(0), b, deterministic=True))(
        layouts["padded"]
    )

    def forward(p, b):
        return model.apply(p, b, deterministic=True).mlm_logits

    def train_grad(p, b, key):
        def loss_fn(p):
            out = model.apply(p, b, deterministic=False, rngs={"dropout": key})
            return pretraining_loss(out, b)[0]

        return jax.grad(loss_fn)(p)

    calls, flops = {}, {}
    for layout, batch in layouts.items():
        for kind, fn, args in (
            ("fwd", forward, (params, batch)),
            ("train", train_grad, (params, batch, jax.random.key(1))),
        ):
            calls[layout, kind], flops[layout, kind] = compiled(fn, args)
    seconds = in_turns(calls, repeats)
    results = []
    for layout, batch in layouts.items():
        sequences = float(batch["sequence_mask"].sum())
        tokens = float((batch["segment_ids"] > 0).sum())
        fwd_s, bwd_s = seconds[layout, "fwd"], seconds[layout, "train"]
        fwd_flops, bwd_flops = flops[layout, "fwd"], flops[layout, "train"]
        results.append(
            dict(
                model=preset,
                length=length,
                layout=layout,
                rows=rows,
                sequences=sequences,
                fill=tokens / (rows * length),
                fwd_ms=1e3 * fwd_s,
                train_ms=1e3 * bwd_s,
                train_seq_per_s=sequences / bwd_s,
                train_gflop=bwd_flops / 1e9,
                train_gflops_per_s=bwd_flops / bwd_s / 1e9,
                train_utilisation=bwd_flops / bwd_s / peak,
                fwd_utilisation=fwd_flops / fwd_s / peak,
            )
        )
        r = results[-1]
        print(
            f"{preset:>5} L={length:<4} {layout:>6}: rows={rows} seqs={sequences:>3.0f} "
            f"fill={r['fill']:.0%} fwd={r['fwd_ms']:8.1f} ms fwd+bwd={r['train_ms']:8.1f} ms "
            f"{r['train_seq_per_s']:7.2f} seq/s {r['train_gflop']:7.1f} GFLOP "
            f"util={r['train_utilisation']:.2f}",
            flush=True,
        )
    return results


def main() -> None:
    args = parse_args()
    rows_for = dict(item.split(":") for item in args.batch.split(","))
    peak = matmul_rate(args.matmul_size, args.repeats)
    print(
        f"{jax.devices()[0].device_kind}: dense float32 matmul {peak / 1e9:.1f} GFLOP/s", flush=True
    )
    results = []
    for preset in args.models.split(","):
        for length in map(int, args.lengths.split(",")):
            results += bench_one(preset, length, int(rows_for.get(preset, 2)), args.repeats, peak)

    print(
        "\n| model | L | layout | seqs/step | fill | fwd ms | fwd+bwd ms | seq/s | "
        "GFLOP/step | util (fwd / fwd+bwd) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['length']} | {r['layout']} | {r['sequences']:.0f} | "
            f"{r['fill']:.0%} | {r['fwd_ms']:.1f} | {r['train_ms']:.1f} | "
            f"{r['train_seq_per_s']:.2f} | {r['train_gflop']:.2f} | "
            f"{r['fwd_utilisation']:.2f} / {r['train_utilisation']:.2f} |"
        )
    print("\nPacked / padded, same rows (train step): ")
    for padded, packed in zip(results[0::2], results[1::2]):
        print(
            f"  {padded['model']} L={padded['length']}: "
            f"{packed['train_seq_per_s'] / padded['train_seq_per_s']:.2f}x sequences/s, "
            f"step time ratio {packed['train_ms'] / padded['train_ms']:.2f}"
        )
    if args.json:
        publish("model_bench", {"matmul_flops_per_s": peak, "results": results})


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


MODEL_COLUMNS: Columns = {
    "model": lambda r: r["model"],
    "L": lambda r: r["length"],
    "layout": lambda r: r["layout"],
    "rows": lambda r: r["rows"],
    "seqs/step": lambda r: f"{r['sequences']:.0f}",
    "fill": lambda r: f"{r['fill']:.0%}",
    "fwd ms": lambda r: whole(r["fwd_ms"]),
    "fwd+bwd ms": lambda r: whole(r["train_ms"]),
    "GFLOP/step": lambda r: f"{r['train_gflop']:.4g}",
    "util fwd / fwd+bwd": lambda r: f"{r['fwd_utilisation']:.2f} / {r['train_utilisation']:.2f}",
    "seq/s (fwd+bwd)": lambda r: f"{1e3 * r['sequences'] / r['train_ms']:.3g}",
}


def model_bench_block(read: Read) -> str:
    r = read("model_bench")["result"]
    padded = {(x["model"], x["length"]): x for x in r["results"] if x["layout"] == "padded"}
    rate = lambda x: x["sequences"] / x["train_ms"]
    over_padded = lambda x: times(rate(x) / rate(padded[x["model"], x["length"]]))
    columns: Columns = {
        **MODEL_COLUMNS,
        "packed / padded seq/s": lambda x: "-" if x["layout"] == "padded" else over_padded(x),
    }
    return (
        f"{source('model_bench', read)}\n\nDense float32 matmul measured at "
        f"{r['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s (utilisation's denominator):\n\n"
        f"{items_table(r['results'], columns)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"model_bench": model_bench_block}


if __name__ == "__main__":
    main()
