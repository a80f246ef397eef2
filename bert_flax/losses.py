"""Pre-training losses and metrics computed per packed sequence.

Sequence slot d of a row (entry d of `nsp_positions`, `next_sentence_labels`, `sequence_mask`)
is the sequence whose tokens carry `segment_ids == d + 1`. A masked prediction belongs to the
sequence `segment_ids[masked_lm_positions]`; padding predictions (`masked_lm_weights == 0`) and
empty slots (`sequence_mask == 0`) contribute nothing.

Metrics are `(sum, count)` pairs so that they aggregate exactly across steps and devices:
the value is `sum(sums) / sum(counts)`.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax

from bert_flax.model import PreTrainingOutput

Array = jax.Array
Metrics = dict[str, tuple[Array, Array]]

MLM_NORMALIZATIONS = ("per_sequence", "per_token")


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
    num_slots = batch["nsp_positions"].shape[-1]
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    mlm_ce = optax.softmax_cross_entropy_with_integer_labels(
        output.mlm_logits, batch["masked_lm_ids"]
    )
    mlm_hit = (jnp.argmax(output.mlm_logits, axis=-1) == batch["masked_lm_ids"]).astype(jnp.float32)
    # [B, P, D]: weight of prediction p in slot d.
    owner = jnp.take_along_axis(batch["segment_ids"], batch["masked_lm_positions"], axis=1)
    assign = jax.nn.one_hot(owner - 1, num_slots, dtype=jnp.float32) * weights[..., None]

    sequence_mask = batch["sequence_mask"].astype(jnp.float32)
    labels = batch["next_sentence_labels"]
    nsp_ce = optax.softmax_cross_entropy_with_integer_labels(output.nsp_logits, labels)
    nsp_hit = (jnp.argmax(output.nsp_logits, axis=-1) == labels).astype(jnp.float32)
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
        next_sentence_labels, sequence_mask, nsp_positions).
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
