"""Packed BERT: the encoder, with pre-training heads (MLM with a tied decoder, per-sequence NSP)
and the per-sequence classifier block they share with fine-tuning heads.

The model consumes the packed-batch contract (`bert_flax.input_pipeline.contract`; a padded batch
is the same contract with one sequence per row):

    model = BertForPreTraining(BertConfig.preset("tiny"))
    variables = model.init(jax.random.key(0), batch, deterministic=True)
    out = model.apply(variables, batch, deterministic=False, rngs={"dropout": rng})
    out.mlm_logits  # [B, P, V] float32, at batch["masked_lm_positions"]
    out.nsp_logits  # [B, D, 2] float32, one per sequence slot (at batch["cls_positions"])

Task heads live with their tasks (`bert_flax.tasks.classification.model`,
`bert_flax.tasks.squad.model`); they share `BertModel.encode`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bert_flax.input_pipeline.contract import PRETRAINING_INPUTS
from bert_flax.model.config import BertConfig
from bert_flax.model.layers import (
    BATCH_LENGTH_EMBED,
    BertEmbeddings,
    BertLayer,
    RelativePositionBias,
    activation,
    make_dense,
    make_layer_norm,
)

Array = jax.Array


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


# Where `BertModel` keeps its layers' parameters: `layer_{i}` each, or with
# `BertConfig.scan_layers` the parameters of every layer stacked along a leading axis (logical
# axis "layers") under `layers/layer`.
SCANNED_LAYERS = ("layers", "layer")


def _layer_names(encoder: Mapping) -> list[str]:
    names = [k for k in encoder if k.startswith("layer_") and k[6:].isdigit()]
    return sorted(names, key=lambda k: int(k[6:]))


def stack_layers(params: Mapping) -> dict:
    """Parameters with `bert/layer_{i}` -> the `scan_layers` layout (unchanged if already)."""
    encoder = dict(params["bert"])
    names = _layer_names(encoder)
    if not names:
        return dict(params)
    layers = [encoder.pop(name) for name in names]
    stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *layers)
    encoder[SCANNED_LAYERS[0]] = {SCANNED_LAYERS[1]: stacked}
    return {**params, "bert": encoder}


def unstack_layers(params: Mapping) -> dict:
    """Parameters in the `scan_layers` layout -> `bert/layer_{i}` (unchanged if already)."""
    encoder = dict(params["bert"])
    if SCANNED_LAYERS[0] not in encoder or _layer_names(encoder):
        return dict(params)
    stacked = encoder.pop(SCANNED_LAYERS[0])[SCANNED_LAYERS[1]]
    count = len(jax.tree.leaves(stacked)[0])
    for i in range(count):
        encoder[f"layer_{i}"] = jax.tree.map(lambda x, i=i: np.asarray(x[i]), stacked)
    return {**params, "bert": encoder}


def match_layer_layout(params: Mapping, like: Mapping) -> dict:
    """`params` in the layer layout of `like` (both with a `bert` encoder)."""
    scanned = SCANNED_LAYERS[0] in like["bert"] and not _layer_names(like["bert"])
    return stack_layers(params) if scanned else unstack_layers(params)


class _ScanStep(nn.Module):
    """One layer as an `nn.scan` step: (hidden states, row inputs) -> (hidden states, None)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, segment_ids, attention_bias, deterministic: bool):
        layer_cls = BertLayer
        if self.config.remat_policy != "none":
            # static_argnums counts `self` as 0: `deterministic` is argument 4.
            policy = _remat_policy(self.config.remat_policy)
            layer_cls = nn.remat(BertLayer, static_argnums=(4,), policy=policy)
        return layer_cls(self.config, name="layer")(
            x, segment_ids, attention_bias, deterministic
        ), None


def _scanned_layers(config: BertConfig) -> nn.Module:
    """The encoder's identical layers as one `nn.scan`: XLA compiles one layer's program."""
    scan = nn.scan(
        _ScanStep,
        variable_axes={"params": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
        length=config.num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    return scan(config)


class BertModel(nn.Module):
    """The BERT encoder: embeddings and `num_layers` layers -> hidden states [B, L, H]. With
    `config.scan_layers` the layers run as one `nn.scan` over stacked parameters
    (`stack_layers` / `unstack_layers` convert between the two layouts)."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = BertEmbeddings(cfg)
        if cfg.relative_attention_buckets:
            self.relative_position_bias = RelativePositionBias(cfg)
        if cfg.scan_layers:
            self.layers = _scanned_layers(cfg)
        else:
            layer_cls = BertLayer
            if cfg.remat_policy != "none":
                # static_argnums counts `self` as 0: `deterministic` is argument 4.
                layer_cls = nn.remat(
                    BertLayer, static_argnums=(4,), policy=_remat_policy(cfg.remat_policy)
                )
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
        bias = None
        if self.config.relative_attention_buckets:
            # One table for every layer, as in T5.
            bias = self.relative_position_bias(input_ids.shape[1])
        if self.config.scan_layers:
            x, _ = self.layers(x, segment_ids, bias, deterministic)
        else:
            for layer in self.layers:
                x = layer(x, segment_ids, bias, deterministic)
        if self.config.pre_layer_norm:
            x = nn.with_logical_constraint(self.final_layer_norm(x), BATCH_LENGTH_EMBED)
        return x

    def encode(
        self, batch: Mapping[str, Array], needs: Sequence[str], contract: str, deterministic: bool
    ) -> Array:
        """Hidden states of a batch's rows, after checking it holds the features `needs` (a
        head's inputs, defined by the module `contract`)."""
        missing = [name for name in needs if name not in batch]
        if missing:
            raise KeyError(
                f"Batch lacks features {missing}; the model reads {list(needs)} ({contract})."
            )
        return self(
            batch["input_ids"],
            batch["token_type_ids"],
            batch["positions"],
            batch["segment_ids"],
            deterministic=deterministic,
        )


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


class ClassificationHead(nn.Module):
    """Pooler (Dense + tanh) on each sequence's [CLS] state, then a `num_labels`-way layer: the
    NSP head (2 labels, no dropout, as BERT's) and the fine-tuning head (dropout on the pooled
    state). `role` names the classifier layer for block-sparse configs."""

    config: BertConfig
    num_labels: int
    role: str = "classifier"
    dropout: bool = True

    @nn.compact
    def __call__(self, cls_states: Array, *, deterministic: bool) -> Array:
        cfg = self.config
        pooled = make_dense(
            cfg, cfg.hidden_size, name="pooler", kernel_axes=("embed", "mlp"), role="pooler"
        )(cls_states)
        pooled = jnp.tanh(pooled)
        if self.dropout:
            pooled = nn.Dropout(cfg.hidden_dropout_rate)(pooled, deterministic=deterministic)
        logits = make_dense(
            cfg,
            self.num_labels,
            name="classifier",
            kernel_axes=("embed", "classes"),
            role=self.role,
        )(pooled)
        return logits.astype(jnp.float32)


EMBEDDING_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def rescale_embeddings(params: Mapping, like: Mapping) -> dict:
    """`params` with its embedding tables multiplied by one factor that gives its word table the
    standard deviation of `like`'s (a fresh initialisation's).

    The encoder computes the same function (LayerNorm follows the tables' sum), but Adam's
    steps are about the same size whatever a weight's scale, so tables that pre-training grew
    move less, relative to their size, than a fresh start's: rescaled, a pre-trained start's
    embeddings learn the new task's words as fast as a random start's do.
    """

    def word_std(tree: Mapping) -> float:
        return float(jnp.std(nn.unbox(tree["bert"]["embeddings"]["word_embeddings"])["embedding"]))

    factor = word_std(like) / word_std(params)
    embeddings = dict(params["bert"]["embeddings"])
    for name in EMBEDDING_TABLES:
        embeddings[name] = jax.tree.map(lambda table: table * factor, embeddings[name])
    return {**params, "bert": {**params["bert"], "embeddings": embeddings}}


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence heads, for packed or padded batches."""

    config: BertConfig

    def setup(self):
        self.bert = BertModel(self.config)
        self.mlm_head = MlmHead(self.config)
        self.nsp_head = ClassificationHead(
            self.config, num_labels=2, role="nsp_classifier", dropout=False
        )

    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool) -> PreTrainingOutput:
        hidden = self.bert.encode(
            batch, PRETRAINING_INPUTS, "bert_flax.input_pipeline.contract", deterministic
        )
        mlm_logits = self.mlm_head(
            gather_rows(hidden, batch["masked_lm_positions"]), self.bert.embeddings
        )
        nsp_logits = self.nsp_head(
            gather_rows(hidden, batch["cls_positions"]), deterministic=deterministic
        )
        return PreTrainingOutput(mlm_logits=mlm_logits, nsp_logits=nsp_logits, hidden_states=hidden)
