"""The sequence-classification head: BERT with a per-sequence classifier (or regressor) over
packed rows, its loss, and the map from pre-trained parameters.

    classifier = BertForSequenceClassification(BertConfig.preset("tiny"), num_labels=2)
    classifier.apply(variables, rows, deterministic=True).logits   # [B, D, num_labels]

Each example is classified from its own [CLS] state (or the mean of its states) through the
pooler, as in BERT.
"""

from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from absl import logging

from bert_flax.input_pipeline.contract import CLASSIFICATION_INPUTS
from bert_flax.model import losses
from bert_flax.model.bert import BertModel, ClassificationHead, gather_rows, rescale_embeddings
from bert_flax.model.config import BertConfig

Array = jax.Array


@flax.struct.dataclass
class ClassificationOutput:
    logits: Array  # [B, D, num_labels] float32, one per sequence slot (num_labels 1: regression)


def mean_states(hidden: Array, segment_ids: Array, slots: int) -> Array:
    """[B, slots, H]: the mean of hidden [B, L, H] over each sequence's tokens (slot d holds
    segment id d + 1); zeros for an empty slot."""
    member = segment_ids[:, :, None] == jnp.arange(1, slots + 1)  # [B, L, slots]
    member = member.astype(jnp.float32)
    sums = jnp.einsum("bls,blh->bsh", member, hidden.astype(jnp.float32))
    return (sums / jnp.maximum(member.sum(axis=1), 1.0)[:, :, None]).astype(hidden.dtype)


# What a classifier reads of each sequence: its [CLS] state (BERT's), or the mean of its states.
POOLINGS = ("cls", "mean")


class BertForSequenceClassification(nn.Module):
    """BERT with a per-sequence classification (or, `num_labels=1`, regression) head, for packed
    or padded rows. Its `bert` and `head/pooler` parameters are those of `BertForPreTraining`'s
    `bert` and `nsp_head/pooler` (`pretrained_encoder` maps one onto the other). `pooling` (of
    `POOLINGS`) says what the head reads: the [CLS] state, or the mean of the sequence's states
    (better from a briefly pre-trained model, whose [CLS] state NSP has not yet taught to
    summarise; docs/training.md, "Fine-tuning and inference")."""

    config: BertConfig
    num_labels: int
    pooling: str = "cls"

    def setup(self):
        if self.num_labels < 1:
            raise ValueError(f"num_labels={self.num_labels} must be >= 1 (1 = regression).")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r} is not one of {POOLINGS}.")
        self.bert = BertModel(self.config)
        self.head = ClassificationHead(self.config, self.num_labels)

    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool) -> ClassificationOutput:
        hidden = self.bert.encode(
            batch, CLASSIFICATION_INPUTS, "bert_flax.tasks.classification.data", deterministic
        )
        if self.pooling == "mean":
            states = mean_states(hidden, batch["segment_ids"], batch["cls_positions"].shape[1])
        else:
            states = gather_rows(hidden, batch["cls_positions"])
        return ClassificationOutput(logits=self.head(states, deterministic=deterministic))


def pretrained_encoder(pretrained: Mapping, classifier_params: Mapping) -> dict:
    """`classifier_params` with the encoder of pre-trained parameters and their pooler where they
    have one (`BertForPreTraining`'s `nsp_head/pooler`, another classifier's `head/pooler`, a
    converted `BertModel`'s); the classification layer keeps its own initialisation, and so
    does the pooler of a model without one (a QA or token classifier's encoder)."""
    head = dict(classifier_params["head"])
    pooler = (pretrained.get("nsp_head") or pretrained.get("head") or {}).get("pooler")
    if pooler is None:
        logging.info("The pre-trained model has no pooler: the classifier initialises its own.")
    else:
        head["pooler"] = pooler
    return {**classifier_params, "bert": pretrained["bert"], "head": head}


def classifier_start(pretrained: Mapping, params: Mapping, *, rescale: bool) -> Mapping:
    """What a classifier (`params`) starts from given `config.init_from`'s parameters: another
    classifier's whole when its head has our shapes, else `pretrained_encoder` of them (the
    classification layer our own), the embedding tables scaled to a fresh initialisation's size
    when `rescale`."""
    if "head" in pretrained:  # already a classifier: kept whole if it has our labels
        theirs, ours = (jax.tree.map(jnp.shape, p["head"]) for p in (pretrained, params))
        if theirs == ours:
            return pretrained
        logging.warning(
            "The pre-trained classifier has %d outputs, this task %d: its classification layer "
            "is dropped (the encoder and pooler kept).",
            jnp.shape(pretrained["head"]["classifier"]["bias"])[0],
            jnp.shape(params["head"]["classifier"]["bias"])[0],
        )
    encoder = pretrained_encoder(pretrained, params)
    return rescale_embeddings(encoder, like=params) if rescale else encoder


def classification_loss(
    output: ClassificationOutput, batch: Mapping[str, Array]
) -> tuple[Array, losses.Metrics]:
    """Per-sequence loss of a packed fine-tuning batch, averaged over its real sequences.

    With `num_labels > 1`: cross-entropy and accuracy of each slot's logits against `labels`;
    with one output: squared error against float `labels` (regression), reported as `mse`.
    Empty slots (`sequence_mask == 0`) contribute nothing.
    """
    mask = batch["sequence_mask"].astype(jnp.float32)
    count = jnp.sum(mask)
    logits = output.logits
    if logits.shape[-1] == 1:
        error = jnp.square(logits[..., 0] - batch["labels"].astype(jnp.float32))
        metrics = {"classification_loss": (jnp.sum(error * mask), count)}
        metrics["mse"] = metrics["classification_loss"]
    else:
        labels = batch["labels"].astype(jnp.int32)
        ce, hit = losses.cross_entropy_and_hits(logits, labels)
        metrics = {
            "classification_loss": (jnp.sum(ce * mask), count),
            "accuracy": (jnp.sum(hit * mask), count),
        }
    return losses.mean(metrics["classification_loss"]), metrics


def eval_outputs(output: ClassificationOutput, batch: Mapping[str, Array]) -> dict[str, Array]:
    """What scoring over the whole evaluation set needs of a batch (`metrics.scores`): each
    slot's logits, label and mask."""
    return {"logits": output.logits, "labels": batch["labels"], "mask": batch["sequence_mask"]}


CLASSIFICATION = losses.Objective(
    loss=classification_loss, terms=("classification_loss",), eval_outputs=eval_outputs
)
