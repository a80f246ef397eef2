"""The masked-LM loss over the vocabulary: one max for both the loss and the accuracy
(`losses.cross_entropy_and_hits`) against optax's cross-entropy plus a separate argmax.

    python -m benchmarks.loss_bench            # ~1 min on 2 CPU cores
    python -m benchmarks.loss_bench --json
    python -m benchmarks.loss_bench --step_configs=tiny,cpu_pretrain --rounds=24   # ~5 min

Times the loss, its accuracy and the gradient with respect to the logits (what a train step
computes at the masked positions), jitted, the two variants taking turns for `--rounds` rounds;
prints each shape's median ratio of the rounds (reference time / ours) and its standard error.
Shapes: the masked positions of a step (rows x P) by the vocabulary, for the tiny CPU step
(16 rows x 22, 30,522 words; and the recipe's 8,192-word vocabulary) and a BERT-base-shaped
packed step at 128 (32 rows x 22) and 512 (8 rows x 79).

--step_configs instead times whole training steps of those configs (`configs/<name>.py` on
synthetic batches), one setup traced with each variant, taking turns (`timing.side_by_side`,
--rounds rounds of 3 steps).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, plus_minus, source, whole
from bert_flax import sharding
from bert_flax.model import losses
from bert_flax.model.losses import cross_entropy_and_hits
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import paired_ratio, side_by_side

# name -> (masked positions of a step, vocabulary)
SHAPES = {
    "tiny 128, 30,522 words": (16 * 22, 30_522),
    "tiny 128, 8,192 words (CPU recipe)": (16 * 22, 8_192),
    "base 128 packed": (32 * 22, 30_522),
    "base 512 packed": (8 * 79, 30_522),
}


def reference(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return ce, (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def loss_and_grad(variant):
    """jit of (loss, accuracy, d loss / d logits) through `variant`."""

    def loss(logits, labels):
        ce, hits = variant(logits, labels)
        return ce.mean(), hits.mean()

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def time_once(fn, logits, labels, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(logits, labels))
    return (time.perf_counter() - start) / repeats


def compare(positions: int, vocab: int, rounds: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(positions, vocab)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, vocab, positions), jnp.int32)
    fns = {"reference": loss_and_grad(reference), "ours": loss_and_grad(cross_entropy_and_hits)}
    outputs = {name: fn(logits, labels) for name, fn in fns.items()}  # compile
    np.testing.assert_allclose(outputs["ours"][1], outputs["reference"][1], atol=1e-5)
    seconds = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            seconds[name].append(time_once(fn, logits, labels, repeats))
    ratio, error = paired_ratio(seconds["reference"], seconds["ours"])
    return {
        "positions": positions,
        "vocab": vocab,
        "reference_ms": 1e3 * float(np.median(seconds["reference"])),
        "ours_ms": 1e3 * float(np.median(seconds["ours"])),
        "speedup": ratio,
        "speedup_error": error,
    }


def traced_setup(config, variant):
    """A train setup whose step was traced (and compiled) with `variant` as the loss's kernel,
    and three synthetic batches."""
    losses.cross_entropy_and_hits = variant  # what pretraining_loss calls when traced
    try:
        setup = create_train_setup(config)
        batches = [
            sharding.global_batch(setup.mesh, setup.task.synthetic_batch(setup.batch_size, i))
            for i in range(3)
        ]
        state, _ = setup.loop_step(setup.state, batches[0], setup.step_key(1), 1)
        jax.block_until_ready(state)
    finally:
        losses.cross_entropy_and_hits = cross_entropy_and_hits
    return dataclasses.replace(setup, state=state), batches


def compare_steps(name: str, rounds: int) -> dict:
    config = importlib.import_module(f"configs.{name}").get_config()
    config.data.synthetic, config.data.data_dir = True, ""
    setups, batches = {}, {}
    for label, variant in (("reference", reference), ("ours", cross_entropy_and_hits)):
        setups[label], batches[label] = traced_setup(config, variant)
    timing = side_by_side(setups, batches, rounds=rounds, steps=3)
    ratio, error = paired_ratio(
        timing["reference"].round_step_seconds, timing["ours"].round_step_seconds
    )
    result = {
        "reference_ms": 1e3 * timing["reference"].step_seconds,
        "ours_ms": 1e3 * timing["ours"].step_seconds,
        "speedup": ratio,
        "speedup_error": error,
    }
    print(
        f"{name}: train step {result['reference_ms']:.1f} ms -> {result['ours_ms']:.1f} ms, "
        f"{ratio:.3f}x ± {ratio * error:.3f} ({rounds} rounds of 3 steps)",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5, help="calls per timed interval")
    parser.add_argument("--step_configs", default="", help="time whole steps of these configs")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    if args.step_configs:
        results = {name: compare_steps(name, args.rounds) for name in args.step_configs.split(",")}
        if args.json:
            publish("loss_bench_steps", results)
        return
    print(
        f"backend {jax.default_backend()}, float32 logits; {args.rounds} rounds of {args.repeats}"
    )
    print(
        f"{'shape':<36} {'positions':>9} {'vocab':>7} {'optax+argmax':>13} {'ours':>8} "
        f"{'ratio':>13}"
    )
    results = {}
    for name, (positions, vocab) in SHAPES.items():
        r = results[name] = compare(positions, vocab, args.rounds, args.repeats)
        print(
            f"{name:<36} {positions:>9} {vocab:>7} {r['reference_ms']:>10.2f} ms "
            f"{r['ours_ms']:>5.2f} ms {r['speedup']:>6.2f}x "
            f"± {r['speedup'] * r['speedup_error']:.2f}"
        )
    if args.json:
        publish("loss_bench", results)


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


LOSS_TIMES: Columns = {
    "optax + argmax": lambda r: f"{r['reference_ms']:.1f} ms",
    "one max": lambda r: f"{r['ours_ms']:.1f} ms",
}


LOSS_SHAPE_COLUMNS: Columns = {
    "masked positions x vocabulary": lambda r: (
        f"{r['shape']}: {whole(r['positions'])} x {whole(r['vocab'])}"
    ),
    **LOSS_TIMES,
    "speed-up": lambda r: plus_minus(r["speedup"], r["speedup_error"]),
}


LOSS_STEP_COLUMNS: Columns = {
    "config": lambda r: r["config"],
    **LOSS_TIMES,
    "speed-up": lambda r: plus_minus(r["speedup"], r["speedup_error"], 3),
}


def loss_bench_block(read: Read) -> str:
    shapes = [{"shape": shape, **r} for shape, r in read("loss_bench")["result"].items()]
    steps = [{"config": config, **r} for config, r in read("loss_bench_steps")["result"].items()]
    return (
        f"{source('loss_bench', read)}\n\nThe loss, its accuracy and its gradient with respect "
        f"to the logits:\n\n{items_table(shapes, LOSS_SHAPE_COLUMNS)}\n\n"
        f"{source('loss_bench_steps', read)}\n\nThe whole train step of `configs/<config>.py`:"
        f"\n\n{items_table(steps, LOSS_STEP_COLUMNS)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"loss_bench": loss_bench_block}


if __name__ == "__main__":
    main()
