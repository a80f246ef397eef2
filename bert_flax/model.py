"""Packed BERT for pre-training: encoder, MLM head (tied decoder) and per-sequence NSP head.

The model consumes the packed-batch contract of DESIGN.md (a padded batch is the same contract
with one sequence per row):

    model = BertForPreTraining(BertConfig.preset("tiny"))
    variables = model.init(jax.random.key(0), batch, deterministic=True)
    out = model.apply(variables, batch, deterministic=False, rngs={"dropout": rng})
    out.mlm_logits  # [B, P, V] float32, at batch["masked_lm_positions"]
    out.nsp_logits  # [B, D, 2] float32, one per sequence slot (at batch["nsp_positions"])
"""

from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bert_flax.config import BertConfig
from bert_flax.layers import (
    BATCH_LENGTH_EMBED,
    BertEmbeddings,
    BertLayer,
    activation,
    make_dense,
    make_layer_norm,
)

Array = jax.Array

MODEL_FEATURES = (
    "input_ids",
    "token_type_ids",
    "segment_ids",
    "positions",
    "masked_lm_positions",
    "nsp_positions",
)
_ROW_FEATURES = ("input_ids", "token_type_ids", "segment_ids", "positions")
_PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
_SLOT_FEATURES = ("nsp_positions", "next_sentence_labels", "sequence_mask")


def check_batch(batch: Mapping[str, np.ndarray], config: BertConfig) -> None:
    """Host-side check of a (numpy) batch against the packed-batch contract and the config.

    Inside jit, out-of-range ids give NaN embeddings and predictions outside every sequence are
    silently left out of the per-sequence losses; call this on a first batch to fail early with
    a message naming the feature. Raises ValueError.
    """
    features = (*_ROW_FEATURES, *_PREDICTION_FEATURES, *_SLOT_FEATURES)
    missing = [name for name in features if name not in batch]
    if missing:
        raise ValueError(f"Batch lacks features {missing} (see the contract in DESIGN.md).")
    b = {name: np.asarray(batch[name]) for name in features}
    for group in (_ROW_FEATURES, _PREDICTION_FEATURES, _SLOT_FEATURES):
        shapes = {name: b[name].shape for name in group}
        if len(set(shapes.values())) != 1 or b[group[0]].ndim != 2:
            raise ValueError(f"Features {list(group)} need one shared [batch, n] shape: {shapes}.")
    length, slots = b["input_ids"].shape[1], b["nsp_positions"].shape[1]
    limits = {
        "input_ids": (config.vocab_size, "vocab_size"),
        "token_type_ids": (config.type_vocab_size, "type_vocab_size"),
        "positions": (config.max_position_embeddings, "max_position_embeddings"),
        "segment_ids": (slots + 1, "the number of sequence slots + 1"),
        "masked_lm_positions": (length, "the row length"),
        "nsp_positions": (length, "the row length"),
    }
    for name, (limit, what) in limits.items():
        low, high = int(b[name].min()), int(b[name].max())
        if low < 0 or high >= limit:
            raise ValueError(f"{name} spans [{low}, {high}], outside [0, {limit}) ({what}).")
    owner = np.take_along_axis(b["segment_ids"], b["masked_lm_positions"], axis=1)
    if np.any((b["masked_lm_weights"] > 0) & (owner == 0)):
        raise ValueError("Some real masked_lm_positions point at padding (segment_ids == 0).")


@flax.struct.dataclass
class PreTrainingOutput:
    mlm_logits: Array  # [B, P, V] float32
    nsp_logits: Array  # [B, D, 2] float32
    hidden_states: Array  # [B, L, H] last encoder layer, compute dtype


def gather_rows(x: Array, positions: Array) -> Array:
    """x [B, L, H] at row indices positions [B, K] -> [B, K, H]."""
    return jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)


def _remat_policy(name: str):
    return {"full": None, "dots": jax.checkpoint_policies.checkpoint_dots}[name]


class BertModel(nn.Module):
    """The BERT encoder: embeddings and `num_layers` layers -> hidden states [B, L, H]."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        layer_cls = BertLayer
        if cfg.remat_policy != "none":
            # static_argnums counts `self` as 0: `deterministic` is argument 3.
            layer_cls = nn.remat(
                BertLayer, static_argnums=(3,), policy=_remat_policy(cfg.remat_policy)
            )
        self.embeddings = BertEmbeddings(cfg)
        self.layers = [layer_cls(cfg, name=f"layer_{i}") for i in range(cfg.num_layers)]
        if cfg.pre_layer_norm:
            self.final_layer_norm = make_layer_norm(cfg, "final_layer_norm")

    def __call__(
        self,
        input_ids: Array,
        token_type_ids: Array,
        positions: Array,
        segment_ids: Array,
        *,
        deterministic: bool,
    ) -> Array:
        x = self.embeddings(input_ids, token_type_ids, positions, deterministic=deterministic)
        for layer in self.layers:
            x = layer(x, segment_ids, deterministic)
        if self.config.pre_layer_norm:
            x = nn.with_logical_constraint(self.final_layer_norm(x), BATCH_LENGTH_EMBED)
        return x


class MlmHead(nn.Module):
    """Transform (Dense, activation, LayerNorm), then the tied decoder plus an output bias."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array, embeddings: BertEmbeddings) -> Array:
        cfg = self.config
        x = make_dense(
            cfg,
            cfg.hidden_size,
            name="transform",
            kernel_axes=("embed", "mlp"),
            role="mlm_transform",
        )(x)
        x = make_layer_norm(cfg, "layer_norm")(activation(cfg.hidden_act, x))
        bias = self.param(
            "bias",
            nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
            (cfg.vocab_size,),
            cfg.param_dtype,
        )
        logits = embeddings.attend(x) + bias.astype(jnp.float32)
        return nn.with_logical_constraint(
            logits, ("activation_batch", "activation_predictions", "activation_vocab")
        )


class NspHead(nn.Module):
    """Pooler (Dense + tanh) on a sequence's [CLS] state, then a 2-way classifier."""

    config: BertConfig

    @nn.compact
    def __call__(self, cls_states: Array) -> Array:
        cfg = self.config
        pooled = make_dense(
            cfg, cfg.hidden_size, name="pooler", kernel_axes=("embed", "mlp"), role="pooler"
        )(cls_states)
        logits = make_dense(
            cfg, 2, name="classifier", kernel_axes=("embed", "classes"), role="nsp_classifier"
        )(jnp.tanh(pooled))
        return logits.astype(jnp.float32)


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence heads, for packed or padded batches."""

    config: BertConfig

    def setup(self):
        self.bert = BertModel(self.config)
        self.mlm_head = MlmHead(self.config)
        self.nsp_head = NspHead(self.config)

    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool) -> PreTrainingOutput:
        missing = [name for name in MODEL_FEATURES if name not in batch]
        if missing:
            raise KeyError(
                f"Batch lacks features {missing}; the packed-batch contract (DESIGN.md) needs "
                f"{list(MODEL_FEATURES)}."
            )
        hidden = self.bert(
            batch["input_ids"],
            batch["token_type_ids"],
            batch["positions"],
            batch["segment_ids"],
            deterministic=deterministic,
        )
        mlm_logits = self.mlm_head(
            gather_rows(hidden, batch["masked_lm_positions"]), self.bert.embeddings
        )
        nsp_logits = self.nsp_head(gather_rows(hidden, batch["nsp_positions"]))
        return PreTrainingOutput(mlm_logits=mlm_logits, nsp_logits=nsp_logits, hidden_states=hidden)
