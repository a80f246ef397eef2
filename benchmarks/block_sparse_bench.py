"""Block-sparse matmul vs dense `jnp.dot`: forward and forward+backward, interleaved in one run.

  python benchmarks/block_sparse_bench.py                      # table, 4096x4096, 256 rows
  python benchmarks/block_sparse_bench.py --json               # one JSON line per case
  python benchmarks/block_sparse_bench.py --block_sizes=32 --densities=0.1 --repeats=20

Each case times, alternately, the dense product with the masked weight and the block-sparse one
(same inputs, jitted, after a warm-up); the figure is the minimum over `--repeats` rounds (the
least disturbed run on a shared machine). fwd+bwd computes y, dx and dW for a fixed cotangent.
Speedup = dense time / block-sparse time.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from bert_flax.block_sparse import block_sparse_matmul, random_layout


def _time(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def bench_case(features: int, rows: int, block_size: int, density: float, repeats: int, impl):
    layout = random_layout(features, features, block_size, density, seed=0)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, features)), jnp.float32)
    g = jnp.asarray(rng.standard_normal((rows, features)), jnp.float32)
    blocks = jnp.asarray(rng.standard_normal(layout.blocks_shape), jnp.float32)
    weight = jnp.asarray(layout.to_dense(blocks))

    sparse = lambda x, b: block_sparse_matmul(x, b, layout, impl=impl)
    dense = jnp.dot

    def fwd_bwd(f):
        def run(x, w, g):
            y, vjp = jax.vjp(f, x, w)
            return y, *vjp(g)

        return jax.jit(run)

    fns = {
        "fwd_dense": (jax.jit(dense), (x, weight)),
        "fwd_sparse": (jax.jit(sparse), (x, blocks)),
        "fwd_bwd_dense": (fwd_bwd(dense), (x, weight, g)),
        "fwd_bwd_sparse": (fwd_bwd(sparse), (x, blocks, g)),
    }
    for fn, args in fns.values():  # compile and warm up
        _time(fn, *args)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, (fn, args) in fns.items():
            times[name].append(_time(fn, *args))
    best = {name: min(t) for name, t in times.items()}
    return {
        "block_size": block_size,
        "density": density,
        "realised_density": round(layout.density, 4),
        "features": features,
        "rows": rows,
        "fwd_dense_ms": round(best["fwd_dense"] * 1e3, 2),
        "fwd_sparse_ms": round(best["fwd_sparse"] * 1e3, 2),
        "fwd_bwd_dense_ms": round(best["fwd_bwd_dense"] * 1e3, 2),
        "fwd_bwd_sparse_ms": round(best["fwd_bwd_sparse"] * 1e3, 2),
        "fwd_speedup": round(best["fwd_dense"] / best["fwd_sparse"], 2),
        "fwd_bwd_speedup": round(best["fwd_bwd_dense"] / best["fwd_bwd_sparse"], 2),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--block_sizes", default="32,16,8")
    parser.add_argument("--densities", default="1.0,0.5,0.25,0.1,0.05")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--impl", default="auto", help="auto | xla | pallas")
    parser.add_argument("--json", action="store_true", help="one JSON line per case")
    args = parser.parse_args()

    if not args.json:
        print(f"backend={jax.default_backend()} devices={jax.devices()} impl={args.impl}")
        print(
            f"{'bs':>3} {'density':>8} {'fwd dense':>10} {'fwd sparse':>11} {'speedup':>8} "
            f"{'f+b dense':>10} {'f+b sparse':>11} {'speedup':>8}"
        )
    for block_size in (int(b) for b in args.block_sizes.split(",")):
        for density in (float(d) for d in args.densities.split(",")):
            r = bench_case(args.features, args.rows, block_size, density, args.repeats, args.impl)
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print(
                    f"{block_size:>3} {density:>8.2f} {r['fwd_dense_ms']:>8.1f}ms "
                    f"{r['fwd_sparse_ms']:>9.1f}ms {r['fwd_speedup']:>7.2f}x "
                    f"{r['fwd_bwd_dense_ms']:>8.1f}ms {r['fwd_bwd_sparse_ms']:>9.1f}ms "
                    f"{r['fwd_bwd_speedup']:>7.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
