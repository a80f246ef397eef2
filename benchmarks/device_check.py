"""The accelerator checks in one prepared script (under 8 minutes), for when a GPU or TPU is lent:

  python -m benchmarks.device_check            # one JSON line per check, then a summary line

1. attention: the cuDNN (`jax.nn.dot_product_attention`), the platform's Pallas kernel that
   visits every block (splash on TPU, pallas_gpu elsewhere) and "auto" (the one that skips the
   blocks sequences never share: packed_tpu on TPU, packed_gpu on GPU) back-ends against XLA's
   dense-mask attention on packed segment ids, bfloat16, BERT-base heads: max error and time of
   each (a back-end that does not run on this platform reports its error).
2. block_sparse: the Pallas block-sparse kernels compiled for blocks of 32 and 16 at 10%
   density, checked against the dense masked matmul, timed forward and forward+backward against
   the dense matmul (medians).
3. utilisation: the BERT-base train step (forward + backward, packed rows of 512, bfloat16):
   FLOP/s from XLA's cost analysis over the measured time, against a bfloat16 matmul's rate.
4. profile: the step profiler on configs/tiny.py (synthetic batches): class shares.
5. prediction: the run's train step (BERT-base phase 2 at 4 layers, packed, bfloat16) timed,
   beside `bert_flax.aot`'s roofline prediction for the same program on this chip (what the
   compile command predicts for a target without one: docs/compile.md).

Every check is independent: a failure prints {"check": ..., "ok": false, "error": ...} and the
next one runs. On a CPU the same checks run at small shapes (a dry run of the script).
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from bert_flax.model import attention

# Full shapes on an accelerator; a quick dry run of the same code on a CPU.
SMALL = jax.default_backend() == "cpu"
REPEATS = 3 if SMALL else 20
BLOCK_SPARSE_IMPL = "xla" if SMALL else "pallas"  # Pallas runs compiled only on GPU/TPU


def timed(fn: Callable, *args, repeats: int = 10) -> float:
    """Median seconds of `fn(*args)` after a compile-and-warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def packed_segments(rows: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of 1-3 sequences and some padding."""
    segments = np.zeros((rows, length), np.int32)
    for r in range(rows):
        cuts = np.sort(rng.choice(np.arange(16, length - 16), size=2, replace=False))
        end = int(rng.integers(cuts[1] + 8, length + 1))
        segments[r, : cuts[0]], segments[r, cuts[0] : cuts[1]] = 1, 2
        segments[r, cuts[1] : end] = 3
    return segments


def check_attention() -> dict:
    rng = np.random.default_rng(0)
    rows, length, heads, dim = (2, 128, 2, 64) if SMALL else (8, 512, 12, 64)
    q, k, v = (
        jnp.asarray(rng.standard_normal((rows, length, heads, dim)), jnp.bfloat16) for _ in range(3)
    )
    segment_ids = jnp.asarray(packed_segments(rows, length, rng))
    real = np.asarray(segment_ids > 0)[..., None, None]
    results = {}
    reference = None
    dense = "splash" if jax.default_backend() == "tpu" else "pallas_gpu"
    for name in ("xla", "cudnn", dense, "auto"):
        fn = jax.jit(lambda q, k, v, s, name=name: attention.attention(q, k, v, s, impl=name))
        try:
            out = np.asarray(fn(q, k, v, segment_ids), np.float32)
            if reference is None:
                reference = out
            error = float(np.max(np.abs(np.where(real, out - reference, 0.0))))
            ms = 1e3 * timed(fn, q, k, v, segment_ids, repeats=REPEATS)
            results[name] = {"ms": ms, "max_error": error}
        except Exception as e:  # a back-end this platform cannot run
            results[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    ok = all("error" not in r and r["max_error"] < 5e-2 for r in results.values())
    return {"ok": ok, "shape": [rows, length, heads, dim], "dtype": "bfloat16", **results}


def check_block_sparse() -> dict:
    from benchmarks.block_sparse_bench import bench_case
    from bert_flax.block_sparse.layout import random_layout
    from bert_flax.block_sparse.matmul import block_sparse_matmul, masked_dense_weight

    cases, ok = [], True
    features, rows = (1024, 64) if SMALL else (4096, 256)
    for block_size in (32, 16):
        layout = random_layout(features, features, block_size, 0.1, seed=0)
        rng = np.random.default_rng(1)
        x = jnp.asarray(rng.standard_normal((rows, features)), jnp.float32)
        blocks = jnp.asarray(rng.standard_normal(layout.blocks_shape), jnp.float32)
        sparse = jax.jit(
            lambda x, b, layout=layout: block_sparse_matmul(x, b, layout, impl=BLOCK_SPARSE_IMPL)
        )
        reference = x @ masked_dense_weight(blocks, layout)
        error = float(jnp.max(jnp.abs(sparse(x, blocks) - reference)) / jnp.max(jnp.abs(reference)))
        case = bench_case(features, rows, block_size, 0.1, repeats=REPEATS, impl=BLOCK_SPARSE_IMPL)
        case.update(impl=BLOCK_SPARSE_IMPL, relative_error=error)
        ok &= error < 1e-2
        cases.append(case)
    return {"ok": ok, "cases": cases}


def check_utilisation() -> dict:
    from benchmarks.model_bench import measure, synthetic_batch
    from bert_flax.model.bert import BertForPreTraining
    from bert_flax.model.config import BertConfig
    from bert_flax.model.losses import pretraining_loss

    size, preset, rows, length = (1024, "tiny", 4, 128) if SMALL else (8192, "base", 32, 512)
    a = jnp.ones((size, size), jnp.bfloat16)
    peak = 2 * size**3 / timed(jax.jit(jnp.dot), a, a, repeats=REPEATS)
    model = BertForPreTraining(BertConfig.preset(preset, dtype="bfloat16"))
    batch = synthetic_batch(np.random.default_rng(0), rows, length, per_row=2, slots=3)
    params = jax.jit(lambda b: model.init(jax.random.key(0), b, deterministic=True))(batch)

    def train_grad(p, b, key):
        def loss(p):
            out = model.apply(p, b, deterministic=False, rngs={"dropout": key})
            return pretraining_loss(out, b)[0]

        return jax.grad(loss)(p)

    seconds, flops = measure(train_grad, (params, batch, jax.random.key(1)), REPEATS)
    return {
        "ok": True,
        "model": f"{preset}, rows {rows} x {length} packed, bfloat16",
        "step_ms": 1e3 * seconds,
        "tflops_per_s": flops / seconds / 1e12,
        "bf16_matmul_tflops_per_s": peak / 1e12,
        "utilisation": flops / seconds / peak,
    }


def check_profile() -> dict:
    from bert_flax.profile.configured import profile_config
    from configs import tiny

    config = tiny.get_config()
    config.data.synthetic = True
    result = profile_config(config, steps=3)
    total = sum(row.time_ms for row in result.classes) or 1.0
    shares = {row.name: round(row.time_ms / total, 4) for row in result.classes}
    return {"ok": bool(shares), "step_ms": result.step_ms, "class_shares": shares}


def check_prediction() -> dict:
    from bert_flax.aot import program, roofline, targets
    from bert_flax.train import setup as train_setup
    from configs import bert_base, tiny

    kind = jax.devices()[0].device_kind
    chips = [t for t in targets.TARGETS.values() if t.chip.name in (kind, kind.split(" 80GB")[0])]
    target = chips[0] if chips else targets.TARGETS["h200"]  # CPU dry run: H200's figures
    config = tiny.get_config() if SMALL else bert_base.get_config("phase2")
    config.data.synthetic = True
    if not SMALL:
        config.model.num_layers, config.train.packing_hparams = 4, "none"
        config.train.batch_size = config.eval.batch_size = 32 * jax.device_count()
    steps = program.compile_steps(config, jax.devices(), evaluate=False)
    predicted = roofline.report(steps, target)
    setup = train_setup.create_train_setup(config)
    state, batch = setup.state, setup.make_batch()
    times = []
    for step in range(REPEATS + 1):
        start = time.perf_counter()
        state, metrics = setup.train_step(state, batch, setup.step_key(step))
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    measured = statistics.median(times[1:])
    return {
        "ok": True,
        "target": target.name if chips else f"none for {kind!r} (dry run with h200's figures)",
        "model": f"{predicted.model['layers']} layers, {predicted.rows_per_step} rows",
        "measured_step_ms": 1e3 * measured,
        "predicted_step_ms": 1e3 * predicted.roofline_step_s,
        "measured_over_predicted": measured / predicted.roofline_step_s,
    }


CHECKS = {
    "attention": check_attention,
    "block_sparse": check_block_sparse,
    "utilisation": check_utilisation,
    "profile": check_profile,
    "prediction": check_prediction,
}


def main() -> None:
    device = jax.devices()[0]
    print(
        json.dumps(
            {
                "check": "device",
                "backend": jax.default_backend(),
                "kind": device.device_kind,
                "count": jax.device_count(),
            }
        ),
        flush=True,
    )
    passed = 0
    for name, check in CHECKS.items():
        start = time.perf_counter()
        try:
            result = check()
        except Exception as e:
            result = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}"[:500],
                "trace": traceback.format_exc()[-1500:],
            }
        result["seconds"] = round(time.perf_counter() - start, 1)
        passed += bool(result["ok"])
        print(json.dumps({"check": name, **result}, default=float), flush=True)
    print(json.dumps({"check": "summary", "passed": passed, "of": len(CHECKS)}), flush=True)


if __name__ == "__main__":
    main()
