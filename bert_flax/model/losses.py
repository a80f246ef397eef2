"""Losses and metrics computed per packed sequence: pre-training (MLM + NSP), the cross-entropy
every task head uses, and the `Objective` a train step minimises.

Sequence slot d of a row (entry d of `cls_positions`, `next_sentence_labels`, `sequence_mask`)
is the sequence whose tokens carry `segment_ids == d + 1`. A masked prediction belongs to the
sequence `segment_ids[masked_lm_positions]`; padding predictions (`masked_lm_weights == 0`) and
empty slots (`sequence_mask == 0`) contribute nothing.

Metrics are `(sum, count)` pairs so that they aggregate exactly across steps and devices:
the value is `sum(sums) / sum(counts)`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from bert_flax.model.bert import PreTrainingOutput

Array = jax.Array
Metrics = dict[str, tuple[Array, Array]]
LossFn = Callable[[Any, Mapping[str, Array]], tuple[Array, Metrics]]


@dataclasses.dataclass(frozen=True)
class Objective:
    """What a train step minimises and an eval step reports.

    `loss(output, batch) -> (loss, metrics)` with `loss == sum(mean(metrics[t]) for t in terms)`
    (the train step's micro-batch accumulation relies on this to add partial sums exactly);
    `eval_metrics(output, batch)` are the metrics evaluation reports (default: the loss's);
    `eval_outputs(output, batch)`, per-row arrays evaluation brings back to the host for the
    task's own scoring over the whole set (`Task.score_outputs`; default: none).
    """

    loss: LossFn
    terms: tuple[str, ...]
    eval_metrics: Callable[[Any, Mapping[str, Array]], Metrics] | None = None
    eval_outputs: Callable[[Any, Mapping[str, Array]], dict[str, Array]] | None = None

    def evaluate(self, output: Any, batch: Mapping[str, Array]) -> Metrics:
        if self.eval_metrics is not None:
            return self.eval_metrics(output, batch)
        return self.loss(output, batch)[1]


MLM_NORMALIZATIONS = ("per_sequence", "per_token")


def cross_entropy_and_hits(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Softmax cross-entropy of integer `labels` and whether each is the prediction, in float32.

    The prediction is `argmax`: the first of classes tied for the largest logit, as every
    framework scores it, so constant (collapsed) logits are right only for class 0, never for
    every label.
    """
    logits = logits.astype(jnp.float32)
    shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    label_shifted = jnp.take_along_axis(shifted, labels[..., None], axis=-1)[..., 0]
    log_normalizer = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    hits = jnp.argmax(logits, axis=-1) == labels
    return log_normalizer - label_shifted, hits.astype(jnp.float32)


def per_sequence_terms(output: PreTrainingOutput, batch: Mapping[str, Array]) -> dict[str, Array]:
    """Per-slot loss terms, each [B, D] float32.

    Returns:
      mlm_loss_sum: summed MLM cross-entropy of the slot's predictions.
      mlm_count: number of real predictions in the slot.
      mlm_correct: number of correct real predictions in the slot.
      nsp_loss: NSP cross-entropy (0 for empty slots).
      nsp_correct: 1 where the NSP prediction is right (0 for empty slots).
      sequence_mask: 1 for real sequences.
    """
    num_slots = batch["cls_positions"].shape[-1]
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    mlm_ce, mlm_hit = cross_entropy_and_hits(output.mlm_logits, batch["masked_lm_ids"])
    # [B, P, D]: weight of prediction p in slot d.
    owner = jnp.take_along_axis(batch["segment_ids"], batch["masked_lm_positions"], axis=1)
    assign = jax.nn.one_hot(owner - 1, num_slots, dtype=jnp.float32) * weights[..., None]

    sequence_mask = batch["sequence_mask"].astype(jnp.float32)
    labels = batch["next_sentence_labels"]
    nsp_ce, nsp_hit = cross_entropy_and_hits(output.nsp_logits, labels)
    return {
        "mlm_loss_sum": jnp.einsum("bp,bpd->bd", mlm_ce, assign),
        "mlm_count": assign.sum(axis=1),
        "mlm_correct": jnp.einsum("bp,bpd->bd", mlm_hit, assign),
        "nsp_loss": nsp_ce * sequence_mask,
        "nsp_correct": nsp_hit * sequence_mask,
        "sequence_mask": sequence_mask,
    }


def pretraining_loss(
    output: PreTrainingOutput,
    batch: Mapping[str, Array],
    *,
    mlm_normalization: str = "per_sequence",
) -> tuple[Array, Metrics]:
    """MLM + NSP loss of a (packed) batch, and metrics as (sum, count) pairs.

    Args:
      output: the model's `PreTrainingOutput`.
      batch: the packed batch (needs masked_lm_positions/ids/weights, segment_ids,
        next_sentence_labels, sequence_mask, cls_positions).
      mlm_normalization: "per_sequence" (default, as in the packing paper): each sequence's MLM
        loss is the mean over its predictions, then averaged over the real sequences that have
        predictions. "per_token": mean over all real predictions of the batch (original BERT).

    Returns:
      (loss, metrics) with loss = mlm_loss + nsp_loss and metrics mlm_loss, nsp_loss,
      mlm_accuracy (per prediction), nsp_accuracy (per sequence), each (sum, count).
    """
    if mlm_normalization not in MLM_NORMALIZATIONS:
        raise ValueError(f"mlm_normalization={mlm_normalization!r} not in {MLM_NORMALIZATIONS}.")
    t = per_sequence_terms(output, batch)
    if mlm_normalization == "per_sequence":
        has_predictions = (t["mlm_count"] > 0).astype(jnp.float32) * t["sequence_mask"]
        per_seq = t["mlm_loss_sum"] / jnp.maximum(t["mlm_count"], 1.0)
        mlm = (jnp.sum(per_seq * has_predictions), jnp.sum(has_predictions))
    else:
        mlm = (jnp.sum(t["mlm_loss_sum"]), jnp.sum(t["mlm_count"]))
    metrics = {
        "mlm_loss": mlm,
        "nsp_loss": (jnp.sum(t["nsp_loss"]), jnp.sum(t["sequence_mask"])),
        "mlm_accuracy": (jnp.sum(t["mlm_correct"]), jnp.sum(t["mlm_count"])),
        "nsp_accuracy": (jnp.sum(t["nsp_correct"]), jnp.sum(t["sequence_mask"])),
    }
    loss = mean(metrics["mlm_loss"]) + mean(metrics["nsp_loss"])
    return loss, metrics


def mean(metric: tuple[Array, Array]) -> Array:
    """sum / count of a metric pair (0 when the count is 0)."""
    total, count = metric
    return total / jnp.maximum(count, 1.0)


def masked_lm_eval_metrics(
    output: PreTrainingOutput, batch: Mapping[str, Array], *, mlm_normalization: str
) -> Metrics:
    """The pre-training metrics plus `masked_lm_accuracy`, the MLPerf BERT metric: correct masked
    tokens over all masked tokens of the evaluation set, which are `mlm_accuracy`'s sums (every
    real prediction lies in a real sequence), reported under the name evaluation reads."""
    _, metrics = pretraining_loss(output, batch, mlm_normalization=mlm_normalization)
    return {**metrics, "masked_lm_accuracy": metrics["mlm_accuracy"]}


def pretraining_objective(mlm_normalization: str = "per_sequence") -> Objective:
    return Objective(
        loss=functools.partial(pretraining_loss, mlm_normalization=mlm_normalization),
        terms=("mlm_loss", "nsp_loss"),
        eval_metrics=functools.partial(masked_lm_eval_metrics, mlm_normalization=mlm_normalization),
    )
