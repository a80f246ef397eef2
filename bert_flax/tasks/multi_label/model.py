"""The multi-label objective: `BertForSequenceClassification`'s K logits per sequence slot, one
sigmoid each, binary cross-entropy averaged over the labels of each real sequence, then over the
sequences (packed rows as padded)."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax

from bert_flax.model import losses
from bert_flax.tasks.classification.model import ClassificationOutput

Array = jax.Array


def multi_label_loss(
    output: ClassificationOutput, batch: Mapping[str, Array]
) -> tuple[Array, losses.Metrics]:
    """Per sequence the mean binary cross-entropy over its K labels, averaged over the real
    sequences; `label_accuracy`: the share of label decisions (at 0.5) that are right."""
    mask = batch["sequence_mask"].astype(jnp.float32)
    count = jnp.sum(mask)
    logits = output.logits.astype(jnp.float32)
    targets = batch["multi_labels"]
    bce = optax.sigmoid_binary_cross_entropy(logits, targets).mean(axis=-1)
    right = jnp.mean(((logits > 0) == (targets > 0.5)).astype(jnp.float32), axis=-1)
    metrics = {
        "multi_label_loss": (jnp.sum(bce * mask), count),
        "label_accuracy": (jnp.sum(right * mask), count),
    }
    return losses.mean(metrics["multi_label_loss"]), metrics


def eval_outputs(output: ClassificationOutput, batch: Mapping[str, Array]) -> dict[str, Array]:
    """Each slot's label probabilities, targets and whether it is real (`Task.score_outputs`
    tunes the threshold over the whole evaluation set)."""
    return {
        "probabilities": jax.nn.sigmoid(output.logits.astype(jnp.float32)),
        "multi_labels": batch["multi_labels"],
        "sequence_mask": batch["sequence_mask"],
    }


MULTI_LABEL = losses.Objective(
    loss=multi_label_loss, terms=("multi_label_loss",), eval_outputs=eval_outputs
)
