"""The train step shared by every optimizer and task, and the eval step: pure functions.

    objective = losses.pretraining_objective("per_sequence")   # or a task's
    step = jax.jit(functools.partial(train_step, model=model, tx=tx, learning_rate=schedule,
                                     objective=objective, accumulation=1))
    state, metrics = step(state, batch, rng)

`create_train_setup` binds them this way, with the shardings of the state and batch, the
partitioning context (`sharding.jit_partitioned`) and donation of the input state.

The batch holds all rows of one optimizer step (global, sharded over the batch axes); with
`accumulation = m` it is split into m micro-batches scanned with `lax.scan`, and the summed
gradient equals that of the whole batch: each micro-batch's loss terms (`objective.terms`) are
divided by the whole batch's counts (sequences, or tokens per the loss's own normalisation), so
packed micro-batches
holding different numbers of sequences add up exactly. Metrics are global sums and counts (they
aggregate over steps and hosts) plus scalars.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_flax import sharding
from bert_flax.model import losses

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    """Everything a step updates; the optimizer itself (an optax transformation) is static."""

    step: jax.Array
    params: Any
    opt_state: optax.OptState
    # Consecutive steps, up to this one, whose loss or gradient was not finite (not applied).
    nonfinite_streak: jax.Array

    @classmethod
    def create(cls, params: Any, tx: optax.GradientTransformation) -> TrainState:
        zero = jnp.zeros((), jnp.int32)
        return cls(step=zero, params=params, opt_state=tx.init(params), nonfinite_streak=zero)


def train_step(
    state: TrainState,
    batch: Batch,
    rng: jax.Array,
    *,
    model: nn.Module,
    tx: optax.GradientTransformation,
    learning_rate: optax.Schedule,
    objective: losses.Objective,
    accumulation: int = 1,
) -> tuple[TrainState, Metrics]:
    """One optimizer step on `batch` (all its micro-batches); `rng` drives dropout.

    A step whose loss, gradient or new parameters are not finite is not applied: parameters and
    optimizer state stay as they were, the step counter advances (the batch is consumed) and
    `nonfinite_streak` counts it (the training loop stops after too many in a row)."""
    if accumulation == 1:
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, metrics), grads = grad_fn(state.params, batch, rng, model=model, objective=objective)
        sums = flatten_sums(metrics)
    else:
        loss, grads, sums = accumulated_gradients(
            state.params,
            batch,
            rng,
            model=model,
            objective=objective,
            accumulation=accumulation,
        )
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)  # any NaN/inf gradient makes the norm so

    def skip(state: TrainState) -> tuple[TrainState, jax.Array]:
        return state.replace(nonfinite_streak=state.nonfinite_streak + 1), jnp.bool_(False)

    def apply(state: TrainState) -> tuple[TrainState, jax.Array]:
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        # A finite gradient can still give a non-finite update (a trust ratio, a matrix root,
        # an overflow at a huge learning rate): the new parameters must be finite too.
        applied = jnp.isfinite(optax.tree.norm(params))
        new = state.replace(params=params, opt_state=opt_state, nonfinite_streak=jnp.int32(0))
        return jax.lax.cond(applied, lambda: (new, applied), lambda: skip(state))

    # A branch rather than a select of new and old values: a select keeps the old optimizer
    # moments alive next to the new ones, so XLA copies them each step (the donated buffers are
    # updated in place): 1.20x on a 7-row fine-tuning step on CPU, measured side by side.
    new_state, finite = jax.lax.cond(finite, apply, skip, state)
    new_state = new_state.replace(step=state.step + 1)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "nonfinite_steps": 1.0 - finite.astype(jnp.float32),
        "nonfinite_streak": new_state.nonfinite_streak.astype(jnp.float32),
        "learning_rate": jnp.asarray(learning_rate(state.step), jnp.float32),
        **sums,
        **batch_statistics(batch),
    }
    return new_state, metrics


def eval_step(
    params: Any, batch: Batch, *, model: nn.Module, objective: losses.Objective
) -> tuple[Metrics, dict[str, jax.Array]]:
    """Sums and counts of `objective`'s evaluation metrics on `batch`, without dropout, and the
    per-row outputs it asks evaluation to bring back (`objective.eval_outputs`; default none)."""
    output = model.apply({"params": params}, batch, deterministic=True)
    metrics = {**flatten_sums(objective.evaluate(output, batch)), **batch_statistics(batch)}
    outputs = objective.eval_outputs(output, batch) if objective.eval_outputs else {}
    return metrics, outputs


def loss_fn(
    params: Any, batch: Batch, rng: jax.Array, *, model: nn.Module, objective: losses.Objective
) -> tuple[jax.Array, dict[str, tuple[jax.Array, jax.Array]]]:
    """`objective`'s loss of `batch` with dropout, and its (sum, count) metrics."""
    output = model.apply({"params": params}, batch, deterministic=False, rngs={"dropout": rng})
    return objective.loss(output, batch)


# -- Micro-batch accumulation --------------------------------------------------------------------


def split_micro_batches(batch: Batch, accumulation: int) -> Batch:
    """[B, ...] -> [m, B/m, ...]; micro-batch j holds rows j, j+m, ... so that each stays evenly
    spread over the data-parallel devices (no data moves between devices)."""

    def split(x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0] // accumulation, accumulation, *x.shape[1:]).swapaxes(0, 1)
        return nn.with_logical_constraint(x, (None, sharding.BATCH))

    return jax.tree_util.tree_map(split, batch)


def loss_term_counts(
    params: Any, batch: Batch, *, model: nn.Module, objective: losses.Objective
) -> dict[str, jax.Array]:
    """The denominators of the whole batch's loss terms. They depend on the batch only, so XLA
    drops the (zero) logits this evaluates the loss on and keeps the counts."""
    shapes = jax.eval_shape(
        lambda p, b: model.apply({"params": p}, b, deterministic=True), params, batch
    )
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    _, metrics = objective.loss(zeros, batch)
    return {k: jnp.maximum(metrics[k][1], 1.0) for k in objective.terms}


def accumulated_gradients(
    params: Any,
    batch: Batch,
    rng: jax.Array,
    *,
    model: nn.Module,
    objective: losses.Objective,
    accumulation: int,
) -> tuple[jax.Array, Any, Metrics]:
    """(loss, gradient, summed metrics) of `batch` as `accumulation` scanned micro-batches; the
    gradient equals the whole batch's."""
    counts = loss_term_counts(params, batch, model=model, objective=objective)
    micro_batches = split_micro_batches(batch, accumulation)

    def share_of_loss(p, micro, r):
        _, metrics = loss_fn(p, micro, r, model=model, objective=objective)
        return sum(metrics[k][0] / counts[k] for k in objective.terms), flatten_sums(metrics)

    micro_grad = jax.grad(share_of_loss, has_aux=True)

    def body(carry, xs):
        grads, sums = carry
        index, micro = xs
        g, micro_sums = micro_grad(params, micro, jax.random.fold_in(rng, index))
        return (jax.tree.map(jnp.add, grads, g), jax.tree.map(jnp.add, sums, micro_sums)), None

    first = jax.tree_util.tree_map(lambda x: x[0], micro_batches)
    sums_shape = jax.eval_shape(lambda: micro_grad(params, first, rng)[1])
    init = (
        jax.tree_util.tree_map(jnp.zeros_like, params),
        jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape),
    )
    (grads, sums), _ = jax.lax.scan(body, init, (jnp.arange(accumulation), micro_batches))
    loss = sum(sums[f"{k}/sum"] / counts[k] for k in objective.terms)
    return loss, grads, sums


# -- Metrics -------------------------------------------------------------------------------------


def batch_statistics(batch: Batch) -> Metrics:
    """Rows, real sequences, real and total tokens (and masked tokens) of a batch."""
    segment_ids = batch["segment_ids"]
    statistics = {
        "rows": jnp.asarray(segment_ids.shape[0], jnp.float32),
        "sequences": jnp.sum(batch["sequence_mask"]).astype(jnp.float32),
        "real_tokens": jnp.sum(segment_ids > 0).astype(jnp.float32),
        "tokens": jnp.asarray(segment_ids.size, jnp.float32),
    }
    if "masked_lm_weights" in batch:
        statistics["masked_tokens"] = jnp.sum(batch["masked_lm_weights"]).astype(jnp.float32)
    return statistics


def flatten_sums(metrics: Mapping[str, tuple[jax.Array, jax.Array]]) -> Metrics:
    """{name: (sum, count)} -> {"name/sum": sum, "name/count": count} as float32."""
    out = {}
    for name, (total, count) in metrics.items():
        out[f"{name}/sum"] = jnp.asarray(total, jnp.float32)
        out[f"{name}/count"] = jnp.asarray(count, jnp.float32)
    return out
