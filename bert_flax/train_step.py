"""One jitted train step for every optimizer, and the eval step.

`train_step(state, batch, rng) -> (state, metrics)`: the batch holds all rows of one optimizer
step (global, sharded over the data axes); with `accumulation = m` it is split into m micro-batches
scanned with `lax.scan`, and the summed gradient equals that of the whole batch: each micro-batch
loss term is weighted by its share of the batch's sequences (or tokens, per the loss's own
normalisation), so packed micro-batches holding different numbers of sequences add up exactly.
Metrics are global sums and counts (they aggregate over steps and hosts) plus scalars.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_flax import losses
from bert_flax import mesh as mesh_lib
from bert_flax.train_state import LogicalRules, TrainState

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]
# Terms of the pre-training objective: loss == sum of sum/count of these metrics.
LOSS_TERMS = ("mlm_loss", "nsp_loss")


def batch_statistics(batch: Batch) -> Metrics:
    """Rows, real sequences, real and total tokens, masked tokens of a batch."""
    segment_ids = batch["segment_ids"]
    return {
        "rows": jnp.asarray(segment_ids.shape[0], jnp.float32),
        "sequences": jnp.sum(batch["sequence_mask"]).astype(jnp.float32),
        "real_tokens": jnp.sum(segment_ids > 0).astype(jnp.float32),
        "tokens": jnp.asarray(segment_ids.size, jnp.float32),
        "masked_tokens": jnp.sum(batch["masked_lm_weights"]).astype(jnp.float32),
    }


def flatten_sums(metrics: Mapping[str, tuple[jax.Array, jax.Array]]) -> Metrics:
    out = {}
    for name, (total, count) in metrics.items():
        out[f"{name}/sum"] = jnp.asarray(total, jnp.float32)
        out[f"{name}/count"] = jnp.asarray(count, jnp.float32)
    return out


def split_micro_batches(batch: Batch, accumulation: int, mesh: Mesh) -> Batch:
    """[B, ...] -> [m, B/m, ...]; micro-batch j holds rows j, j+m, ... so that each stays evenly
    spread over the data-parallel devices (no data moves between devices)."""
    sharding = NamedSharding(mesh, PartitionSpec(None, mesh_lib.batch_axes(mesh)))

    def split(x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0] // accumulation, accumulation, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(x, sharding)

    return jax.tree_util.tree_map(split, batch)


def make_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    learning_rate: optax.Schedule,
    mesh: Mesh,
    rules: LogicalRules,
    *,
    accumulation: int = 1,
    mlm_normalization: str = "per_sequence",
) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, Metrics]]:
    """The un-jitted step; `jit_train_step` adds shardings and donation."""

    def loss_fn(params: Any, batch: Batch, rng: jax.Array):
        output = model.apply({"params": params}, batch, deterministic=False, rngs={"dropout": rng})
        loss, metrics = losses.pretraining_loss(output, batch, mlm_normalization=mlm_normalization)
        return loss, (output, metrics)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def loss_term_counts(params: Any, batch: Batch) -> dict[str, jax.Array]:
        # The denominators of the whole batch's loss; they depend on the batch only, so XLA drops
        # the (zero) logits computation and keeps the counts.
        shapes = jax.eval_shape(
            lambda p, b: model.apply({"params": p}, b, deterministic=True), params, batch
        )
        zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        _, metrics = losses.pretraining_loss(zeros, batch, mlm_normalization=mlm_normalization)
        return {k: jnp.maximum(metrics[k][1], 1.0) for k in LOSS_TERMS}

    def accumulated_grads(params: Any, batch: Batch, rng: jax.Array):
        counts = loss_term_counts(params, batch)
        micro_batches = split_micro_batches(batch, accumulation, mesh)

        def objective(p, micro, r):
            _, (_, metrics) = loss_fn(p, micro, r)
            share = sum(metrics[k][0] / counts[k] for k in LOSS_TERMS)
            return share, metrics

        micro_grad = jax.grad(objective, has_aux=True)

        def body(carry, xs):
            grads, sums = carry
            index, micro = xs
            g, metrics = micro_grad(params, micro, jax.random.fold_in(rng, index))
            grads = jax.tree_util.tree_map(jnp.add, grads, g)
            sums = jax.tree_util.tree_map(jnp.add, sums, flatten_sums(metrics))
            return (grads, sums), None

        first = jax.tree_util.tree_map(lambda x: x[0], micro_batches)
        sums_shape = jax.eval_shape(lambda: flatten_sums(micro_grad(params, first, rng)[1]))
        init = (
            jax.tree_util.tree_map(jnp.zeros_like, params),
            jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape),
        )
        (grads, sums), _ = jax.lax.scan(body, init, (jnp.arange(accumulation), micro_batches))
        loss = sum(sums[f"{k}/sum"] / counts[k] for k in LOSS_TERMS)
        return loss, grads, sums

    def train_step(state: TrainState, batch: Batch, rng: jax.Array):
        with mesh_lib.partitioning(mesh, rules):
            if accumulation == 1:
                (loss, (_, metrics)), grads = grad_fn(state.params, batch, rng)
                sums = flatten_sums(metrics)
            else:
                loss, grads, sums = accumulated_grads(state.params, batch, rng)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": jnp.asarray(learning_rate(state.step), jnp.float32),
            **sums,
            **batch_statistics(batch),
        }
        return new_state, metrics

    return train_step


def jit_train_step(
    train_step: Callable, state_shardings: TrainState, mesh: Mesh
) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, Metrics]]:
    """`jax.jit` with explicit in/out shardings; the input state is donated."""
    return jax.jit(
        train_step,
        in_shardings=(state_shardings, mesh_lib.batch_sharding(mesh), mesh_lib.replicated(mesh)),
        out_shardings=(state_shardings, mesh_lib.replicated(mesh)),
        donate_argnums=(0,),
    )


def make_eval_step(
    model: nn.Module, mesh: Mesh, rules: LogicalRules, *, mlm_normalization: str = "per_sequence"
) -> Callable[[Any, Batch], Metrics]:
    """Jitted `eval_step(params, batch) -> metrics` (sums and counts).

    `masked_lm_accuracy` counts correct masked tokens over all masked tokens of the evaluation
    set (the MLPerf BERT metric); the model's own per-sequence metrics are reported beside it.
    """

    def eval_step(params: Any, batch: Batch) -> Metrics:
        with mesh_lib.partitioning(mesh, rules):
            output = model.apply({"params": params}, batch, deterministic=True)
            _, metrics = losses.pretraining_loss(output, batch, mlm_normalization=mlm_normalization)
        weights = batch["masked_lm_weights"]
        correct = jnp.argmax(output.mlm_logits, axis=-1) == batch["masked_lm_ids"]
        metrics = dict(metrics)
        metrics["masked_lm_accuracy"] = (jnp.sum(weights * correct), jnp.sum(weights))
        return {**flatten_sums(metrics), **batch_statistics(batch)}

    return jax.jit(
        eval_step,
        in_shardings=(None, mesh_lib.batch_sharding(mesh)),
        out_shardings=mesh_lib.replicated(mesh),
    )
