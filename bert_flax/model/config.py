"""BERT model configuration and the standard size presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import ml_collections
from ml_collections.config_dict import placeholder

from bert_flax.block_sparse.bert import BlockSparseConfig
from bert_flax.kernels import segment_attention
from bert_flax.model import attention

HIDDEN_ACTS = ("gelu", "gelu_tanh", "relu", "silu")
REMAT_POLICIES = ("none", "full", "dots")
ATTENTION_DROPOUT_BITS = (32, 8)

# (num_layers, hidden_size, num_heads); intermediate_size is 4 * hidden_size. "tiny" .. "medium"
# are the compact BERTs of Turc et al. (2019), "base" and "large" the original BERT shapes.
_PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder with pre-training heads.

    Attributes:
      vocab_size: WordPiece vocabulary size (the MLM decoder is tied to the word embeddings).
      hidden_size: width of the residual stream.
      num_layers: number of transformer layers.
      num_heads: attention heads per layer; must divide `hidden_size`.
      intermediate_size: width of the feed-forward block.
      max_position_embeddings: rows of the position table; `positions` must stay below it.
      type_vocab_size: number of token types (sentence A/B).
      hidden_dropout_rate: dropout on embeddings and on each sub-layer output.
      attention_dropout_rate: dropout on attention probabilities (only the "xla" backend has it);
        0.0 skips it, as some large-scale trainers do.
      attention_dropout_head_groups: 0 draws one attention-dropout mask per head (BERT); g > 0
        draws g per row, each shared by num_heads / g heads: g / num_heads of the random bits,
        the dominant dropout cost at length 512 (docs/profile.md, "Dropout's bits").
      attention_dropout_bits: random bits per attention-dropout mask entry: 32 (BERT's
        Bernoulli draw) or 8 (four entries per 32-bit word, as FlashAttention: a quarter of
        the draws, the rate rounded to a multiple of 1/256, so 0.1 becomes 26/256 = 0.1016).
      hidden_act: "gelu" (exact, erf), "gelu_tanh" (the tanh approximation of the original
        Google BERT code), "relu" or "silu".
      layer_norm_eps: LayerNorm epsilon.
      initializer_range: stddev of the truncated-normal initialiser (as in the original BERT).
      dtype: compute dtype (e.g. "bfloat16"); softmax, LayerNorm statistics and logits are
        always float32.
      param_dtype: parameter dtype (float32 unless you know why not).
      attention_impl: a key of `bert_flax.model.attention.BACKENDS`: "xla" (dense mask, any
        backend), "cudnn" (`jax.nn.dot_product_attention`, cuDNN on GPU), "splash" (Pallas splash
        attention on TPU), "packed_tpu" (Pallas flash attention on TPU skipping the blocks that
        sequences never share), "pallas_gpu" (Pallas flash attention over segments on GPU),
        "packed_gpu" (the same, visiting only the blocks a row's sequences share) or "auto" (the
        platform the program is built for picks: packed_tpu on TPU, packed_gpu on GPU, xla on
        CPU and for rows that are not a multiple of 128; without attention dropout, so the
        model is the same whatever it resolves to). A Pallas kernel on the other
        accelerator is an error (it could only run in interpret mode); on CPU it is interpreted.
      attention_interpret: run the Pallas kernels ("splash", "packed_tpu", "pallas_gpu",
        "packed_gpu", "auto"'s) in Pallas interpret mode on any platform: orders of magnitude
        slower, for debugging a kernel.
      pre_layer_norm: False for the original post-LN BERT, True for pre-LN layers (with a final
        LayerNorm after the last layer).
      relative_attention_buckets: 0 for BERT's attention; otherwise a learned bias on the
        attention logits per head and bucket of the offset between key and query positions
        (T5's relative attention: exact buckets for small offsets, log-spaced ones up to
        `relative_attention_max_distance`, half the buckets for each direction), shared by all
        layers and added to BERT's absolute position embeddings. A deviation from BERT that lets
        a small model find its neighbours early (docs/training.md, "A CPU pre-training recipe").
      relative_attention_max_distance: offsets at or beyond it share the last bucket.
      relative_attention_neighbour_bias: the initial bias of head 0 toward the previous token
        and of head 1 toward the next (0: every bucket starts at zero, as in T5). A small BERT
        otherwise spends thousands of steps on the unigram plateau before its attention finds
        the neighbours that predict a masked token (docs/training.md).
      remat_policy: activation rematerialisation per layer: "none", "full" or "dots"
        (save matmul outputs only).
      scan_layers: run the identical encoder layers as one `nn.scan` over parameters stacked
        along a leading "layers" axis, so XLA compiles one layer's program (a 24-layer model
        compiles about as fast as one layer) and the step's buffers are reused layer after
        layer. Parameters live at `bert/layers/layer/...` instead of `bert/layer_{i}/...`
        (`bert_flax.model.bert.stack_layers` / `unstack_layers`; conversion and `init_from` convert
        between the two). Not with block-sparse layers (each layer has its own layout).
      block_sparse: None for dense layers, otherwise the block-sparse layer settings consulted by
        `bert_flax.model.layers.make_dense` (see docs/block_sparse.md).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    attention_dropout_head_groups: int = 0
    attention_dropout_bits: int = 32
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    dtype: Any = "float32"
    param_dtype: Any = "float32"
    attention_impl: str = "xla"
    attention_interpret: bool = False
    pre_layer_norm: bool = False
    relative_attention_buckets: int = 0
    relative_attention_max_distance: int = 128
    relative_attention_neighbour_bias: float = 0.0
    remat_policy: str = "none"
    scan_layers: bool = False
    block_sparse: Any = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
        object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
        object.__setattr__(self, "block_sparse", BlockSparseConfig.coerce(self.block_sparse))
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}."
            )
        for field, value, allowed in (
            ("attention_impl", self.attention_impl, tuple(attention.BACKENDS)),
            ("hidden_act", self.hidden_act, HIDDEN_ACTS),
            ("remat_policy", self.remat_policy, REMAT_POLICIES),
            ("attention_dropout_bits", self.attention_dropout_bits, ATTENTION_DROPOUT_BITS),
        ):
            if value not in allowed:
                raise ValueError(f"{field}={value!r} is not one of {allowed}.")
        if (
            self.attention_dropout_rate > 0
            and not attention.BACKENDS[self.attention_impl].supports_dropout
        ):
            with_dropout = [k for k, b in attention.BACKENDS.items() if b.supports_dropout]
            raise ValueError(
                f"attention_impl={self.attention_impl!r} has no attention-probability dropout; "
                f"set attention_dropout_rate=0.0 or use attention_impl in {with_dropout}."
            )
        if (
            self.attention_dropout_rate > 0
            and (self.attention_dropout_head_groups or self.attention_dropout_bits != 32)
            and not attention.BACKENDS[self.attention_impl].supports_dropout_variants
        ):
            raise ValueError(
                f"attention_impl={self.attention_impl!r} draws its own attention-dropout mask: "
                "set attention_dropout_head_groups=0 and attention_dropout_bits=32, or use "
                "attention_impl='xla'."
            )
        if self.attention_interpret and not (
            attention.BACKENDS[self.attention_impl].platform
            or self.attention_impl == attention.AUTO
        ):
            raise ValueError(
                f"attention_interpret=True interprets Pallas kernels; attention_impl="
                f"{self.attention_impl!r} is none: set attention_interpret=False."
            )
        groups = self.attention_dropout_head_groups
        if groups < 0 or (groups and self.num_heads % groups):
            raise ValueError(
                f"attention_dropout_head_groups={groups} must be 0 (one mask per head) or divide "
                f"num_heads={self.num_heads}."
            )
        if self.attention_dropout_bits == 8 and self.attention_dropout_rate > 0:
            # raises where the rate is finer than 8 bits can draw
            segment_attention.byte_keep_threshold(1.0 - self.attention_dropout_rate)
        self._check_relative_attention()
        if self.scan_layers and self.block_sparse is not None:
            raise ValueError(
                "scan_layers=True stacks identical layers, but block-sparse layers each have "
                "their own layout: set scan_layers=False (or disable block_sparse)."
            )

    def _check_relative_attention(self) -> None:
        buckets, distance = self.relative_attention_buckets, self.relative_attention_max_distance
        if not buckets:
            if self.relative_attention_neighbour_bias:
                raise ValueError(
                    "relative_attention_neighbour_bias needs relative_attention_buckets > 0."
                )
            return
        if buckets < 4 or buckets % 2 or distance <= buckets // 4:
            raise ValueError(
                f"relative_attention_buckets={buckets} must be 0 or an even number >= 4, and "
                f"relative_attention_max_distance={distance} above a quarter of it (e.g. 32, 128)."
            )
        if self.relative_attention_neighbour_bias and self.num_heads < 2:
            raise ValueError(
                "relative_attention_neighbour_bias biases heads 0 and 1: it needs num_heads >= 2."
            )
        if not attention.BACKENDS[self.attention_impl].supports_bias:
            with_bias = [k for k, b in attention.BACKENDS.items() if b.supports_bias]
            raise ValueError(
                f"attention_impl={self.attention_impl!r} takes no logit bias; set "
                f"relative_attention_buckets=0 or use attention_impl in {with_bias}."
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """Returns a named preset ("tiny" .. "large") with `overrides` applied."""
        if name not in _PRESETS:
            raise ValueError(f"Unknown BERT preset {name!r}; choose one of {sorted(_PRESETS)}.")
        num_layers, hidden_size, num_heads = _PRESETS[name]
        fields = dict(
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_heads=num_heads,
            intermediate_size=4 * hidden_size,
        )
        fields.update(overrides)
        return cls(**fields)

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (dtypes as names) that `from_dict` reads back."""
        out = dataclasses.asdict(self)
        out["dtype"] = self.dtype.name
        out["param_dtype"] = self.param_dtype.name
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BertConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(
                f"Unknown BertConfig fields {sorted(unknown)}; known: {sorted(known)}."
            )
        return cls(**values)


# -- The `config.model` section of a training config ---------------------------------------------

# BertConfig fields a training config sets elsewhere: the compute dtype is `config.train.dtype`.
TRAINING_OWNED_FIELDS = ("dtype",)
_FIELD_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def config_section(preset: str = "tiny") -> ml_collections.ConfigDict:
    """`config.model`: `preset` plus every BertConfig field, each a placeholder meaning "the
    preset's value" (so `--config.model.num_layers=2` works), and `block_sparse`: `enabled` plus
    every `BlockSparseConfig` field at its default."""
    section = ml_collections.ConfigDict({"preset": preset})
    for field in dataclasses.fields(BertConfig):
        if field.name in TRAINING_OWNED_FIELDS:
            continue
        if field.name == "block_sparse":
            sparse = {f.name: f.default for f in dataclasses.fields(BlockSparseConfig)}
            section.block_sparse = ml_collections.ConfigDict({"enabled": False, **sparse})
        else:
            section[field.name] = placeholder(_FIELD_TYPES.get(field.type, str))
    return section


def resolved_config_section(model_config: BertConfig, preset: str) -> ml_collections.ConfigDict:
    """`config.model` as a run resolved it: every field at the value its model was built with
    (the preset's where the config left a placeholder), under the `preset` it named."""
    section = config_section(preset)
    values = model_config.to_dict()
    sparse = values.pop("block_sparse")
    for name in section:
        if name not in ("preset", "block_sparse"):
            section[name] = values[name]
    if sparse:
        section.block_sparse.update({"enabled": True, **sparse})
    return section


# `config.model.preset` naming no size: the model of the checkpoint `config.init_from` (its
# architecture and vocabulary size; the fields config.model sets still win).
INIT_FROM_PRESET = "init_from"


def from_config_section(
    section: ml_collections.ConfigDict, init_from: BertConfig | None = None, **fields: Any
) -> BertConfig:
    """The BertConfig a `config.model` section describes; `fields` (e.g. dtype) win.
    `init_from`: the config of `config.init_from`'s model, what `INIT_FROM_PRESET` stands for."""
    values = section.to_dict()
    preset, sparse = values.pop("preset"), values.pop("block_sparse", None)
    known = {f.name for f in dataclasses.fields(BertConfig)} - set(TRAINING_OWNED_FIELDS)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"config.model has unknown fields {unknown}; valid: {sorted(known)}.")
    values = {k: v for k, v in values.items() if v is not None}
    if sparse and sparse.pop("enabled"):
        values["block_sparse"] = sparse
    if preset != INIT_FROM_PRESET:
        return BertConfig.preset(preset, **values, **fields)
    if init_from is None:
        raise ValueError(
            f"config.model.preset={INIT_FROM_PRESET!r} takes the model config.init_from holds: "
            f"set config.init_from to a checkpoint, or name a preset ({', '.join(_PRESETS)})."
        )
    return init_from.replace(**values, **fields)
