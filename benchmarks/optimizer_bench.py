"""Optimizer benchmark: Shampoo against Adam and LAMB, side by side in one run.

(a) steps to a target loss, each optimizer at the best learning rate of a small sweep, on an
    ill-conditioned regression, a small autoencoder and the tiny packed BERT's MLM loss;
(b) train-step time of the tiny packed BERT with Shampoo (asynchronous roots, N = 10 and 100;
    synchronous, N = 1) over LAMB;
(c) time of one inverse-root computation against the matrix size (coupled Newton and eigh).

  python -m benchmarks.optimizer_bench              # ~10 min on 2 shared CPU cores
  python -m benchmarks.optimizer_bench --quick --json

With --json the last line is one JSON object with the figures (see `summary` in main()).
The BERT MLM task uses synthetic packed batches (the packed-batch contract) whose masked tokens
are learnable: each sequence draws its words from one of a few "topics" (token ranges), so the
masked word is predictable from the sequence's other words.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.core import meta

import optim
from benchmarks.lib.records import publish
from bert_flax.input_pipeline import synthetic
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.model import losses
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig
from optim import matrix_roots

Batch = dict[str, jax.Array]
LossFn = Callable[[object, Batch], jax.Array]


# -- problems --------------------------------------------------------------------------------
def _rotated(rng: np.random.Generator, n: int, d: int, spread: float) -> np.ndarray:
    """An n x d matrix with singular values logspace(0, -spread) and random singular vectors."""
    z, _ = np.linalg.qr(rng.normal(size=(n, d)))
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (z * np.logspace(0, -spread, d)) @ q.T


def regression_problem():
    """min_W |A W B - C|^2 with A, B conditioned 10^1.5 each (Hessian condition 1e6)."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(_rotated(rng, 128, 64, 1.5), jnp.float32)
    b = jnp.asarray(_rotated(rng, 32, 32, 1.5), jnp.float32)
    c = a @ jnp.asarray(rng.normal(size=(64, 32)), jnp.float32) @ b
    params = {"w": jnp.zeros((64, 32))}
    loss = lambda p, _: jnp.sum((a @ p["w"] @ b - c) ** 2)
    return params, loss, lambda step: None, 1e-4 * float(loss(params, None))


def autoencoder_problem():
    """A 64-32-8-32-64 tanh autoencoder on data with a decaying (rotated) spectrum.

    Target: within 10% of the best rank-8 linear reconstruction (PCA) error.
    """
    rng = np.random.default_rng(1)
    data = rng.normal(size=(1024, 64)) @ _rotated(rng, 64, 64, 2.0)
    singular_values = np.linalg.svd(data, compute_uv=False)
    target = 1.1 * float(np.sum(singular_values[8:] ** 2) / data.size)
    data = jnp.asarray(data, jnp.float32)
    sizes = [64, 32, 8, 32, 64]
    params = {
        f"layer_{i}": {
            "kernel": jnp.asarray(rng.normal(size=(m, n)) / np.sqrt(m), jnp.float32),
            "bias": jnp.zeros(n),
        }
        for i, (m, n) in enumerate(itertools.pairwise(sizes))
    }

    def loss(p, batch):
        h = batch
        for i in range(len(sizes) - 1):
            h = h @ p[f"layer_{i}"]["kernel"] + p[f"layer_{i}"]["bias"]
            h = jnp.tanh(h) if i < len(sizes) - 2 else h
        return jnp.mean((h - batch) ** 2)

    def batches(step):
        start = (step * 128) % 1024
        return data[start : start + 128]

    return params, loss, batches, target


TOPIC_SIZE = 16


def topic_batch(config: BertConfig, rows: int, seq_len: int, depth: int, seed: int) -> Batch:
    """A packed batch whose words come from one topic (a range of TOPIC_SIZE ids) per sequence."""
    shape = RowShape(seq_len, depth, max(4, seq_len * 3 // 20))
    batch = synthetic.random_batch(rows, shape, vocab_size=config.vocab_size, seed=seed)
    rng = np.random.default_rng(seed + 7)
    first = synthetic.MASK_ID + 1
    topics = (config.vocab_size - first) // TOPIC_SIZE
    seg = batch["segment_ids"]
    topic_of = rng.integers(0, topics, size=(rows, depth + 1))
    words = first + TOPIC_SIZE * np.take_along_axis(topic_of, seg, 1)
    words = words + rng.integers(0, TOPIC_SIZE, size=seg.shape)
    ids = batch["input_ids"]
    is_word = (ids >= first) | (ids == synthetic.MASK_ID)
    original = np.where(is_word, words, ids).astype(np.int32)
    rows_idx = np.arange(rows)[:, None]
    batch["masked_lm_ids"] = np.where(
        batch["masked_lm_weights"] > 0, original[rows_idx, batch["masked_lm_positions"]], 0
    ).astype(np.int32)
    masked = np.zeros_like(seg, bool)
    masked[rows_idx, batch["masked_lm_positions"]] = batch["masked_lm_weights"] > 0
    batch["input_ids"] = np.where(masked, synthetic.MASK_ID, original).astype(np.int32)
    return {k: jnp.asarray(v) for k, v in batch.items()}


def bert_problem(config: BertConfig, rows: int, seq_len: int, depth: int = 3, num_batches=8):
    model = BertForPreTraining(config)
    stream = [topic_batch(config, rows, seq_len, depth, seed) for seed in range(num_batches)]
    params = meta.unbox(model.init(jax.random.key(0), stream[0], deterministic=True)["params"])

    def mlm_loss(p, batch):
        output = model.apply({"params": p}, batch, deterministic=True)
        _, metrics = losses.pretraining_loss(output, batch)
        return losses.mean(metrics["mlm_loss"])

    return params, mlm_loss, lambda step: stream[step % num_batches]


# -- training ----------------------------------------------------------------------------------
def make_step(tx: optax.GradientTransformation, loss: LossFn):
    @jax.jit
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step


def losses_over_steps(tx, params, loss, batches, steps) -> np.ndarray:
    step, opt_state, values = make_step(tx, loss), tx.init(params), []
    for i in range(steps):
        params, opt_state, value = step(params, opt_state, batches(i))
        opt_state = optim.after_step(tx, opt_state, i)
        values.append(value)
        if not np.isfinite(float(value)):
            break
    return np.asarray(jax.device_get(values), np.float64)


def steps_to_target(curve: np.ndarray, target: float) -> int | None:
    hits = np.flatnonzero(curve <= target)
    return int(hits[0]) + 1 if hits.size else None


OPTIMIZERS: dict[str, Callable[[float], optax.GradientTransformation]] = {
    "adam": lambda lr: optax.adam(lr),
    "lamb": lambda lr: optim.create("lamb", learning_rate=lr),
    "shampoo": lambda lr: optim.create(
        "shampoo", learning_rate=lr, start_preconditioning_step=5, preconditioning_compute_steps=5
    ),
}


def sweep(problem, lrs, steps, target) -> dict[str, dict]:
    """Each optimizer's best run over its learning rates: fewest steps, then lowest loss."""
    params, loss, batches = problem[:3]
    results = {}
    for name, make in OPTIMIZERS.items():
        rows = []
        for lr in lrs[name]:
            curve = losses_over_steps(make(lr), params, loss, batches, steps)
            hit = steps_to_target(curve, target)
            final = float(curve[-1]) if curve.size else float("nan")
            rows.append({"lr": lr, "steps_to_target": hit, "final_loss": final})
            print(f"  {name:<8} lr {lr:<7g} steps to target {hit!s:>5}  final loss {final:.4g}")
        rank = lambda r: (
            r["steps_to_target"] or np.inf,
            np.nan_to_num(r["final_loss"], nan=np.inf),
        )
        results[name] = min(rows, key=rank)
    return results


# -- (b) step time -----------------------------------------------------------------------------
class _Run:
    """One optimizer's training run, advanced one step at a time."""

    def __init__(self, tx, params, loss, batches):
        self.tx, self.step, self.batches = tx, make_step(tx, loss), batches
        self.params, self.opt_state, self.i = params, tx.init(params), 0

    def advance(self) -> float:
        """One step (dispatch, device, after_step); returns its wall time."""
        start = time.perf_counter()
        self.params, self.opt_state, value = self.step(
            self.params, self.opt_state, self.batches(self.i)
        )
        self.opt_state = optim.after_step(self.tx, self.opt_state, self.i)
        jax.block_until_ready(value)
        self.i += 1
        return time.perf_counter() - start


def interleaved_step_seconds(txs, params, loss, batches, steps) -> tuple[dict, dict]:
    """Mean seconds per step of each ``name: (tx, warmup)``, timed round-robin.

    Round-robin, so that the load of a shared machine hits all optimizers alike; the mean, not
    the median, so that host hand-offs every N steps and any waits for roots count.
    """
    runs = {}
    for name, (tx, warmup) in txs.items():
        runs[name] = _Run(tx, params, loss, batches)
        for _ in range(warmup):
            runs[name].advance()
    times = {name: [] for name in runs}
    for _ in range(steps):
        for name, run in runs.items():
            times[name].append(run.advance())
    seconds = {name: float(np.mean(t)) for name, t in times.items()}
    return seconds, {name: optim.host_metrics(run.tx, run.opt_state) for name, run in runs.items()}


# -- (c) root time -----------------------------------------------------------------------------
def root_seconds(n: int, method: str, repeats: int = 3) -> float:
    rng = np.random.default_rng(n)
    g = rng.normal(size=(n, 4 * n)).astype(np.float32)
    a = jnp.asarray(g @ g.T / (4 * n))
    if method == "newton":
        fn = jax.jit(functools.partial(matrix_roots.inverse_pth_root, p=4))
    else:
        fn = jax.jit(functools.partial(matrix_roots.inverse_pth_root_eigh, p=4))
    jax.block_until_ready(fn(a))
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(a))
    return (time.perf_counter() - start) / repeats


def main(argv: Iterator[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and sizes")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--parts", default="abc", help="which parts to run, e.g. 'b' or 'ac'")
    args = parser.parse_args(argv)
    summary: dict[str, object] = {"steps_to_target": {}}

    if "a" in args.parts:
        part_a(summary, args.quick)
    if "b" in args.parts:
        part_b(summary, args.quick)
    if "c" in args.parts:
        part_c(summary, args.quick)
    if args.json:
        publish("optimizer_bench", summary)


def part_a(summary: dict, quick: bool) -> None:
    print("(a) steps to target, best learning rate of a sweep")
    lrs = {name: (1e-2, 3e-2, 1e-1, 3e-1, 1.0) for name in OPTIMIZERS}
    problems = {
        "ill_conditioned_regression": (regression_problem(), lrs, 300),
        "autoencoder": (autoencoder_problem(), lrs, 300),
    }
    for name, (problem, problem_lrs, steps) in problems.items():
        print(f" {name}: target {problem[3]:.4g}, up to {steps} steps")
        summary["steps_to_target"][name] = sweep(problem, problem_lrs, steps, problem[3])
    mlm_config = BertConfig.preset("tiny", vocab_size=1024)
    mlm = bert_problem(mlm_config, rows=8, seq_len=64)
    mlm_target = float(np.log(TOPIC_SIZE)) + 1.0
    mlm_lrs = {
        "adam": (3e-4, 1e-3, 3e-3),
        "lamb": (1e-2, 3e-2, 1e-1),
        "shampoo": (3e-4, 1e-3, 3e-3),
    }
    mlm_steps = 100 if quick else 150
    print(
        f" tiny_bert_mlm (vocab 1024, topic floor ln {TOPIC_SIZE} = {np.log(TOPIC_SIZE):.2f}): "
        f"target {mlm_target:.3f}, up to {mlm_steps} steps"
    )
    summary["steps_to_target"]["tiny_bert_mlm"] = sweep(mlm, mlm_lrs, mlm_steps, mlm_target)


def part_b(summary: dict, quick: bool) -> None:
    print("(b) tiny packed BERT train-step time (vocab 30522), side by side")
    rows, seq_len = (8, 128)
    params, loss, batches = bert_problem(BertConfig.preset("tiny"), rows, seq_len, num_batches=4)
    shampoo = functools.partial(optim.create, "shampoo", learning_rate=1e-3)
    start = 10  # start_preconditioning_step (the default)
    # name: (tx, warmup steps). Asynchronous runs warm up past their first root job's bound
    # (N = 10) or submission (N = 100: no further job is due in the timed window), so that
    # compiling the host solver stays out of the timing.
    timed = {
        "lamb": (optim.create("lamb", learning_rate=1e-3), 3),
        "shampoo_async_n10": (
            shampoo(asynchronous=True, preconditioning_compute_steps=10),
            start + 10 + 2,
        ),
        "shampoo_async_n100": (
            shampoo(asynchronous=True, preconditioning_compute_steps=100),
            start + 2,
        ),
        "shampoo_sync_n1": (
            shampoo(preconditioning_compute_steps=1, start_preconditioning_step=1),
            3,
        ),
    }
    steps = 10 if quick else 30
    seconds, host = interleaved_step_seconds(timed, params, loss, batches, steps)
    for name in timed:
        metrics = {k.removeprefix("shampoo/"): float(f"{v:.3g}") for k, v in host[name].items()}
        print(
            f"  {name:<20} {1e3 * seconds[name]:8.1f} ms/step  "
            f"({seconds[name] / seconds['lamb']:.2f}x LAMB)  {metrics or ''}"
        )
    summary["step_seconds"] = seconds
    summary["shampoo_async_over_lamb_step_time"] = seconds["shampoo_async_n10"] / seconds["lamb"]
    summary["shampoo_async_n100_over_lamb_step_time"] = (
        seconds["shampoo_async_n100"] / seconds["lamb"]
    )
    summary["shampoo_sync_over_lamb_step_time"] = seconds["shampoo_sync_n1"] / seconds["lamb"]
    summary["bert_step"] = {"rows": rows, "seq_len": seq_len, "preset": "tiny"}


def part_c(summary: dict, quick: bool) -> None:
    print("(c) one inverse 4th root, seconds")
    sizes = (64, 128, 256) if quick else (64, 128, 256, 512, 1024)
    summary["root_seconds"] = {}
    for n in sizes:
        newton, eigh = root_seconds(n, "newton"), root_seconds(n, "eigh")
        summary["root_seconds"][n] = {"newton": newton, "eigh": eigh}
        print(f"  n = {n:<5} newton {1e3 * newton:9.2f} ms   eigh {1e3 * eigh:9.2f} ms")


if __name__ == "__main__":
    main()
