"""Block-sparse matmul vs dense `jnp.dot`: forward and forward+backward, interleaved in one run.

  python -m benchmarks.block_sparse_bench                      # table, 4096x4096, 256 rows
  python -m benchmarks.block_sparse_bench --json               # the cases as one JSON line
  python -m benchmarks.block_sparse_bench --block_sizes=32 --densities=0.1 --repeats=20
  python -m benchmarks.block_sparse_bench --impls=cpu,xla      # the C++ kernel vs the XLA path

One dense baseline per shape (the product with a dense weight, forward and forward+backward,
jitted once) is timed in every round of every case, alternating with that case's block-sparse
product on the same inputs, so it is sampled throughout the run: its figure is the median over
all of its samples, with their spread (interquartile range over the median). A block-sparse
case's figure is the median over its --repeats rounds. Speedup = dense median / block-sparse
median. fwd+bwd computes y, dx and dW for a fixed cotangent.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, run_sources, runs, times
from bert_flax.block_sparse import block_sparse_matmul, random_layout, resolve_impl


def _time(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def fwd_bwd(f):
    def run(x, w, g):
        y, vjp = jax.vjp(f, x, w)
        return y, *vjp(g)

    return jax.jit(run)


def median_and_spread(samples: list[float]) -> tuple[float, float]:
    q1, q2, q3 = np.percentile(samples, [25, 50, 75])
    return float(q2), float((q3 - q1) / q2)


class DenseBaseline:
    """The dense products of one shape, compiled once; their samples pooled over the run."""

    def __init__(self, features: int, rows: int):
        rng = np.random.default_rng(0)
        self.x = jnp.asarray(rng.standard_normal((rows, features)), jnp.float32)
        self.g = jnp.asarray(rng.standard_normal((rows, features)), jnp.float32)
        weight = jnp.asarray(rng.standard_normal((features, features)), jnp.float32)
        self.fns = {
            "fwd": (jax.jit(jnp.dot), (self.x, weight)),
            "fwd_bwd": (fwd_bwd(jnp.dot), (self.x, weight, self.g)),
        }
        for fn, args in self.fns.values():  # compile and warm up
            _time(fn, *args)
        self.samples: dict[str, list[float]] = {name: [] for name in self.fns}

    def sample(self, name: str) -> None:
        fn, args = self.fns[name]
        self.samples[name].append(_time(fn, *args))


def bench_case(dense: DenseBaseline, block_size: int, density: float, repeats: int, impl):
    rows, features = dense.x.shape
    layout = random_layout(features, features, block_size, density, seed=0)
    rng = np.random.default_rng(1)
    blocks = jnp.asarray(rng.standard_normal(layout.blocks_shape), jnp.float32)
    sparse = lambda x, b: block_sparse_matmul(x, b, layout, impl=impl)
    fns = {
        "fwd": (jax.jit(sparse), (dense.x, blocks)),
        "fwd_bwd": (fwd_bwd(sparse), (dense.x, blocks, dense.g)),
    }
    for fn, args in fns.values():  # compile and warm up
        _time(fn, *args)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, (fn, args) in fns.items():
            dense.sample(name)
            times[name].append(_time(fn, *args))
    result = {
        "impl": resolve_impl(impl, block_size),
        "block_size": block_size,
        "density": density,
        "realised_density": round(layout.density, 4),
        "features": features,
        "rows": rows,
    }
    for name, samples in times.items():
        result[f"{name}_sparse_ms"] = round(median_and_spread(samples)[0] * 1e3, 3)
        result[f"{name}_sparse_spread"] = round(median_and_spread(samples)[1], 3)
    return result


def with_dense(result: dict, dense: DenseBaseline) -> dict:
    """Adds the dense baseline's median over the whole run, its spread and the speed-ups."""
    for name, samples in dense.samples.items():
        median, spread = median_and_spread(samples)
        result[f"{name}_dense_ms"] = round(median * 1e3, 3)
        result[f"{name}_dense_spread"] = round(spread, 3)
        result[f"{name}_dense_samples"] = len(samples)
        result[f"{name}_speedup"] = round(median * 1e3 / result[f"{name}_sparse_ms"], 2)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--block_sizes", default="32,16,8")
    parser.add_argument("--densities", default="1.0,0.5,0.25,0.1,0.05")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--impls", default="auto", help="Comma-separated: auto | cpu | xla | pallas (each case)."
    )
    parser.add_argument("--json", action="store_true", help="the cases as one JSON line")
    args = parser.parse_args()

    dense = DenseBaseline(args.features, args.rows)
    cases = [
        bench_case(dense, int(block_size), float(density), args.repeats, impl)
        for block_size in args.block_sizes.split(",")
        for density in args.densities.split(",")
        for impl in args.impls.split(",")
    ]
    cases = [with_dense(r, dense) for r in cases]  # one baseline: the whole run's median
    if args.json:
        publish("block_sparse_bench", {"cases": cases})
        return
    r = cases[0]
    print(
        f"backend={jax.default_backend()} devices={jax.devices()}; "
        f"{args.rows} x {args.features} @ {args.features} x {args.features}, float32; "
        f"dense baseline (median of {r['fwd_dense_samples']} samples over the run): "
        f"fwd {r['fwd_dense_ms']:.1f} ms (spread {r['fwd_dense_spread']:.0%}), "
        f"fwd+bwd {r['fwd_bwd_dense_ms']:.1f} ms (spread {r['fwd_bwd_dense_spread']:.0%})"
    )
    print(
        f"{'impl':>6} {'bs':>3} {'density':>8} {'fwd sparse':>11} {'spread':>7} {'speedup':>8} "
        f"{'f+b sparse':>11} {'spread':>7} {'speedup':>8}"
    )
    for r in cases:
        print(
            f"{r['impl']:>6} {r['block_size']:>3} {r['density']:>8.2f} "
            f"{r['fwd_sparse_ms']:>9.1f}ms "
            f"{r['fwd_sparse_spread']:>7.0%} {r['fwd_speedup']:>7.2f}x "
            f"{r['fwd_bwd_sparse_ms']:>9.1f}ms {r['fwd_bwd_sparse_spread']:>7.0%} "
            f"{r['fwd_bwd_speedup']:>7.2f}x"
        )
    print(f"({args.repeats} rounds per case; spread = interquartile range / median)")


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def block_sparse_row(read: Read) -> tuple[str, str]:
    def case(record: dict, impl: str, density: float) -> dict:
        cases = record["result"]["cases"]
        key = (impl, 32, density)
        return next(c for c in cases if (c["impl"], c["block_size"], c["density"]) == key)

    record = read("block_sparse_bench")
    ten, five = case(record, "cpu", 0.1), case(record, "cpu", 0.05)
    xla = case(record, "xla", 0.1)
    others = [case(run, "cpu", 0.1) for run in record.get("earlier_runs", [])]
    again = "".join(
        f"; {o['fwd_bwd_speedup']:.2f}x / {o['fwd_speedup']:.2f}x in another run" for o in others
    )
    side = ten["features"]
    return f"block-sparse {side}x{side} vs dense `jnp.dot`, block 32, C++ CPU kernel", (
        f"10% density: **{ten['fwd_bwd_speedup']:.2f}x forward+backward** "
        f"({ten['fwd_speedup']:.2f}x forward{again}), 5%: {five['fwd_bwd_speedup']:.1f}x; "
        f"the XLA path {xla['fwd_bwd_speedup']:.2f}x"
    )


BLOCK_SPARSE_COLUMNS: Columns = {
    "implementation": lambda c: c["impl"],
    "block": lambda c: c["block_size"],
    "density": lambda c: f"{c['density']:.0%}",
    "dense forward (ms)": lambda c: c["fwd_dense_ms"],
    "sparse forward (ms)": lambda c: c.get("fwd_sparse_ms", "-"),
    "forward speed-up": lambda c: times(c["fwd_speedup"]),
    "dense forward+backward (ms)": lambda c: c["fwd_bwd_dense_ms"],
    "sparse forward+backward (ms)": lambda c: c.get("fwd_bwd_sparse_ms", "-"),
    "forward+backward speed-up": lambda c: times(c["fwd_bwd_speedup"]),
}


def block_sparse_block(read: Read) -> str:
    """Its run's cases, then those of the earlier runs it keeps (block 32 at 10 %: the last row)."""
    *earlier, own = runs("block_sparse_bench", read)
    *earlier_sources, own_source = run_sources("block_sparse_bench", read)
    cases = [c for run in (own, *earlier) for c in run["result"]["cases"]]
    sources = [own_source, *(f"{line} (its rows are the last)" for line in earlier_sources)]
    side = cases[0]["features"]
    return (
        "\n\n".join(sources) + f"\n\n{side}x{side} weights, float32:\n\n"
        f"{items_table(cases, BLOCK_SPARSE_COLUMNS)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"block_sparse_bench": block_sparse_block}
README_ROW = (
    block_sparse_row,
    "`python -m benchmarks.block_sparse_bench --impls=cpu,xla` "
    "([results](docs/results.md#block-sparse))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
