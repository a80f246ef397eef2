"""BERT for extractive question answering: start and end logits over every token (the
`qa_outputs` layer of Hugging Face's `BertForQuestionAnswering`), and their loss on packed rows,
where each sequence's answer is sought only among its own context tokens and its [CLS]."""

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
QA_INPUTS = ROW_FEATURES


@flax.struct.dataclass
class QuestionAnsweringOutput:
    start_logits: Array  # [B, L] float32
    end_logits: Array  # [B, L] float32


class BertForQuestionAnswering(nn.Module):
    config: BertConfig

    def setup(self):
        self.bert = BertModel(self.config)
        self.qa_outputs = make_dense(
            self.config, 2, name="qa_outputs", kernel_axes=("embed", "classes"), role="classifier"
        )

    def __call__(
        self, batch: Mapping[str, Array], *, deterministic: bool
    ) -> QuestionAnsweringOutput:
        hidden = self.bert.encode(batch, QA_INPUTS, "bert_flax.tasks.squad.rows", deterministic)
        logits = self.qa_outputs(hidden).astype(jnp.float32)
        return QuestionAnsweringOutput(start_logits=logits[..., 0], end_logits=logits[..., 1])


def slot_logits(logits: Array, batch: Mapping[str, Array]) -> Array:
    """[B, D, L]: each slot's logits over its own context tokens and its [CLS], a large negative
    number elsewhere (so a softmax over L is one over the slot's candidates)."""
    slots = jnp.arange(1, batch["cls_positions"].shape[1] + 1)
    own = batch["segment_ids"][:, None, :] == slots[None, :, None]  # [B, D, L]
    columns = jnp.arange(logits.shape[1])
    is_cls = columns[None, None, :] == batch["cls_positions"][:, :, None]
    allowed = own & ((batch["context_mask"][:, None, :] > 0) | is_cls)
    return jnp.where(allowed, logits[:, None, :], -1e9)


def qa_loss(output: QuestionAnsweringOutput, batch: Mapping[str, Array]):
    """Per sequence the mean of the start and end cross-entropies, averaged over the real
    sequences (as the pre-training losses); start and end accuracies."""
    mask = batch["sequence_mask"].astype(jnp.float32)
    count = jnp.sum(mask)
    ce_start, hit_start = losses.cross_entropy_and_hits(
        slot_logits(output.start_logits, batch), batch["start_positions"]
    )
    ce_end, hit_end = losses.cross_entropy_and_hits(
        slot_logits(output.end_logits, batch), batch["end_positions"]
    )
    metrics = {
        "qa_loss": (jnp.sum(0.5 * (ce_start + ce_end) * mask), count),
        "start_accuracy": (jnp.sum(hit_start * mask), count),
        "end_accuracy": (jnp.sum(hit_end * mask), count),
    }
    return losses.mean(metrics["qa_loss"]), metrics


def eval_outputs(output: QuestionAnsweringOutput, batch: Mapping[str, Array]) -> dict[str, Array]:
    """What scoring needs of an evaluation batch: the logits, and which window each slot holds
    from which row index (`predict.window_logits`)."""
    return {
        "start_logits": output.start_logits,
        "end_logits": output.end_logits,
        "window_ids": batch["window_ids"],
        "cls_positions": batch["cls_positions"],
    }


QA = losses.Objective(loss=qa_loss, terms=("qa_loss",), eval_outputs=eval_outputs)
