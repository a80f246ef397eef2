"""BERT for token classification: a label's logits at every token (the `classifier` layer of
Hugging Face's `BertForTokenClassification`), and their loss on packed rows.

    model = BertForTokenClassification(BertConfig.preset("tiny"), num_labels=9)
    model.apply(variables, rows, deterministic=True).logits     # [B, L, num_labels]

Parameters: {"bert": BertModel's, "classifier": {"kernel": [H, K], "bias": [K]}}, as Hugging
Face's. Attention stays within each sentence of a row, so a token's logits do not depend on the
row's other sentences.
"""

from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_flax.input_pipeline.contract import ROW_FEATURES
from bert_flax.model import losses
from bert_flax.model.bert import BertModel
from bert_flax.model.config import BertConfig
from bert_flax.model.layers import make_dense

Array = jax.Array
TOKEN_INPUTS = ROW_FEATURES


@flax.struct.dataclass
class TokenClassificationOutput:
    logits: Array  # [B, L, num_labels] float32


class BertForTokenClassification(nn.Module):
    """BERT, dropout, and a Dense layer `classifier` over every token."""

    config: BertConfig
    num_labels: int

    def setup(self):
        if self.num_labels < 2:
            raise ValueError(f"num_labels={self.num_labels} must be >= 2.")
        self.bert = BertModel(self.config)
        self.dropout = nn.Dropout(self.config.hidden_dropout_rate)
        self.classifier = make_dense(
            self.config,
            self.num_labels,
            name="classifier",
            kernel_axes=("embed", "classes"),
            role="classifier",
        )

    def __call__(
        self, batch: Mapping[str, Array], *, deterministic: bool
    ) -> TokenClassificationOutput:
        hidden = self.bert.encode(
            batch, TOKEN_INPUTS, "bert_flax.tasks.token_classification.rows", deterministic
        )
        hidden = self.dropout(hidden, deterministic=deterministic)
        return TokenClassificationOutput(logits=self.classifier(hidden).astype(jnp.float32))


def token_loss(
    output: TokenClassificationOutput, batch: Mapping[str, Array]
) -> tuple[Array, losses.Metrics]:
    """Cross-entropy averaged over the labelled tokens (`label_mask`), and their accuracy."""
    mask = batch["label_mask"].astype(jnp.float32)
    count = jnp.sum(mask)
    labels = jnp.maximum(batch["token_labels"], 0)
    ce, hit = losses.cross_entropy_and_hits(output.logits, labels)
    metrics = {
        "token_loss": (jnp.sum(ce * mask), count),
        "token_accuracy": (jnp.sum(hit * mask), count),
    }
    return losses.mean(metrics["token_loss"]), metrics


def eval_outputs(output: TokenClassificationOutput, batch: Mapping[str, Array]) -> dict[str, Array]:
    """What scoring needs of a batch: each token's predicted label, and which sentence each slot
    holds from which row index (`predict.word_predictions`)."""
    return {
        "predictions": jnp.argmax(output.logits, axis=-1).astype(jnp.int32),
        "sentence_ids": batch["sentence_ids"],
        "cls_positions": batch["cls_positions"],
    }


TOKEN_CLASSIFICATION = losses.Objective(
    loss=token_loss, terms=("token_loss",), eval_outputs=eval_outputs
)
