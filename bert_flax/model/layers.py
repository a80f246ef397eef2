"""BERT building blocks: the Dense/LayerNorm factories, embeddings, attention and encoder layer.

Every parameter carries logical axis names (see `bert_flax.sharding.LOGICAL_AXIS_RULES`) and
the main activations are constrained to logical axes, so the same module shards for data, FSDP
and tensor parallelism by changing only the rule table and mesh.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_flax.block_sparse.bert import make_block_sparse_dense
from bert_flax.model.attention import attention
from bert_flax.model.config import BertConfig

Array = jax.Array

# Logical axes of the main activations.
BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")
BATCH_LENGTH_MLP = ("activation_batch", "activation_length", "activation_mlp")
BATCH_LENGTH_HEADS_KV = (
    "activation_batch",
    "activation_length",
    "activation_heads",
    "activation_kv",
)


def kernel_init(config: BertConfig, axes: Sequence[str]) -> nn.initializers.Initializer:
    init = nn.initializers.truncated_normal(stddev=config.initializer_range)
    return nn.with_logical_partitioning(init, tuple(axes))


def make_dense(
    config: BertConfig, features: int, *, name: str, kernel_axes: tuple[str, str], role: str
) -> nn.Module:
    """Creates every Dense layer of the model (the single switch point for block sparsity).

    Args:
      config: model config; `config.block_sparse` selects block-sparse layers when not None.
      features: output width.
      name: parameter scope name (stable: checkpoints and conversion rely on it).
      kernel_axes: logical (input, output) axis names of the kernel; the bias gets the output one.
      role: what the layer is for: "query", "key", "value", "attention_output",
        "ffn_intermediate", "ffn_output" (encoder) or "pooler", "mlm_transform",
        "nsp_classifier", "classifier" (heads). Lets a block-sparse config pick which layers
        it replaces.
    """
    if config.block_sparse is not None:
        # The roles that `config.block_sparse` selects become BlockSparseDense; others stay dense.
        sparse = make_block_sparse_dense(
            config, features, name=name, kernel_axes=kernel_axes, role=role
        )
        if sparse is not None:
            return sparse
    return nn.Dense(
        features,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        kernel_init=kernel_init(config, kernel_axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (kernel_axes[1],)),
        name=name,
    )


def make_layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    """LayerNorm with float32 statistics (flax computes them in >= float32) and float32 params."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)),
        name=name,
    )


def activation(name: str, x: Array) -> Array:
    if name == "gelu":
        return nn.gelu(x, approximate=False)
    if name == "gelu_tanh":
        return nn.gelu(x, approximate=True)
    if name == "relu":
        return nn.relu(x)
    if name == "silu":
        return nn.silu(x)
    raise ValueError(f"Unknown hidden_act {name!r}.")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dropout(x: Array, key: Array, keep_prob: float) -> Array:
    mask = jax.random.bernoulli(key, p=keep_prob, shape=x.shape)
    return jax.lax.select(mask, x / keep_prob, jnp.zeros_like(x))


def _dropout_forward(x: Array, key: Array, keep_prob: float) -> tuple[Array, Array]:
    return _dropout(x, key, keep_prob), key  # the key, not the mask, waits for the backward


def _dropout_backward(keep_prob: float, key: Array, grad: Array) -> tuple[Array, None]:
    mask = jax.random.bernoulli(key, p=keep_prob, shape=grad.shape)  # drawn again
    return jax.lax.select(mask, grad / keep_prob, jnp.zeros_like(grad)), None


_dropout.defvjp(_dropout_forward, _dropout_backward)


class Dropout(nn.Dropout):
    """`nn.Dropout` that keeps no mask for the backward pass: the backward draws it again from
    the same key. Outputs and gradients are those of `nn.Dropout` (bit for bit, with the same
    name: tested), but no [batch, length, features] mask is written in the forward pass and
    read back in the backward one (two per layer; docs/compile.md, "Naming the traffic")."""

    @nn.compact
    def __call__(self, inputs: Array, deterministic: bool | None = None, rng=None) -> Array:
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate == 1.0 or self.broadcast_dims:
            raise ValueError(f"Dropout takes 0 <= rate < 1 and no broadcast_dims ({self}).")
        rng = self.make_rng(self.rng_collection) if rng is None else rng
        return _dropout(inputs, rng, 1.0 - self.rate)


def _embed(config: BertConfig, num: int, axes: tuple[str, str], name: str) -> nn.Embed:
    return nn.Embed(
        num,
        config.hidden_size,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        embedding_init=kernel_init(config, axes),
        name=name,
    )


class BertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout.

    Positions are the per-sequence `positions` feature (restarting at 0 in every packed
    sequence), never the row index.
    """

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.word_embeddings = _embed(cfg, cfg.vocab_size, ("vocab", "embed"), "word_embeddings")
        self.position_embeddings = _embed(
            cfg, cfg.max_position_embeddings, ("position_table", "embed"), "position_embeddings"
        )
        self.token_type_embeddings = _embed(
            cfg, cfg.type_vocab_size, ("type_table", "embed"), "token_type_embeddings"
        )
        self.layer_norm = make_layer_norm(cfg, "layer_norm")
        self.dropout = Dropout(cfg.hidden_dropout_rate)

    def __call__(
        self, input_ids: Array, token_type_ids: Array, positions: Array, *, deterministic: bool
    ) -> Array:
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_type_ids)
        )
        x = self.dropout(self.layer_norm(x), deterministic=deterministic)
        return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)

    def attend(self, x: Array) -> Array:
        """Tied MLM decoder: float32 logits of x against the word-embedding table."""
        table = self.word_embeddings.embedding.astype(self.config.dtype)
        logits = jnp.einsum(
            "...h,vh->...v", x.astype(self.config.dtype), table, preferred_element_type=jnp.float32
        )
        return logits


def relative_position_bucket(offset: Array, num_buckets: int, max_distance: int) -> Array:
    """T5's bidirectional bucketing of `offset` = key position - query position (int array).

    Half the buckets per direction (offsets <= 0 first); within a half, offsets below a quarter
    of `num_buckets` get one bucket each and larger ones log-spaced buckets up to
    `max_distance`, beyond which all share the half's last bucket.
    """
    half = num_buckets // 2
    exact = half // 2
    distance = jnp.abs(offset)
    log_ratio = jnp.log(jnp.maximum(distance, exact) / exact) / np.log(max_distance / exact)
    far = jnp.minimum(exact + (log_ratio * (half - exact)).astype(jnp.int32), half - 1)
    return jnp.where(offset > 0, half, 0) + jnp.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """A learned [heads] bias per bucket of key-minus-query offset: row length L ->
    [1, heads, L, L] float32 logit bias, the same for every row
    (`BertConfig.relative_attention_buckets`).

    The offset is taken between row indices: within a sequence, packed or not, positions count
    up by one per token, so it equals the offset between their `positions`; pairs of tokens of
    different sequences get a bias too, but the attention masks them. One [L, L] table instead
    of one per row keeps the gather (and its gradient's scatter) batch-independent.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, length: int) -> Array:
        cfg = self.config
        table = self.param(
            "bias",
            nn.with_logical_partitioning(self._init, ("relative_buckets", "relative_heads")),
            (cfg.relative_attention_buckets, cfg.num_heads),
            cfg.param_dtype,
        )
        rows = jnp.arange(length)
        offset = rows[None, :] - rows[:, None]  # [query, key]
        bucket = relative_position_bucket(
            offset, cfg.relative_attention_buckets, cfg.relative_attention_max_distance
        )
        return jnp.transpose(table[bucket], (2, 0, 1))[None].astype(jnp.float32)

    def _init(self, key: Array, shape: tuple[int, int], dtype) -> Array:
        """Zeros, but for `relative_attention_neighbour_bias` on head 0 at offset -1 (the
        previous token) and head 1 at offset +1 (the next): those heads start out reading the
        masked token's neighbours instead of averaging the whole sequence."""
        del key
        cfg = self.config
        previous, following = relative_position_bucket(
            jnp.array([-1, 1]), cfg.relative_attention_buckets, cfg.relative_attention_max_distance
        )
        strength = cfg.relative_attention_neighbour_bias
        return jnp.zeros(shape, dtype).at[previous, 0].add(strength).at[following, 1].add(strength)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention within packed sequences, with its output projection."""

    config: BertConfig

    @nn.compact
    def __call__(
        self, x: Array, segment_ids: Array, bias: Array | None, *, deterministic: bool
    ) -> Array:
        cfg = self.config
        heads = (cfg.num_heads, cfg.head_dim)

        def project(role: str) -> Array:
            dense = make_dense(
                cfg, cfg.hidden_size, name=role, kernel_axes=("embed", "joined_kv"), role=role
            )
            y = dense(x).reshape(*x.shape[:-1], *heads)
            return nn.with_logical_constraint(y, BATCH_LENGTH_HEADS_KV)

        q, k, v = project("query"), project("key"), project("value")
        use_dropout = not deterministic and cfg.attention_dropout_rate > 0.0
        out = attention(
            q,
            k,
            v,
            segment_ids,
            impl=cfg.attention_impl,
            dropout_rate=cfg.attention_dropout_rate,
            dropout_rng=self.make_rng("dropout") if use_dropout else None,
            deterministic=deterministic,
            bias=bias,
            dropout_head_groups=cfg.attention_dropout_head_groups,
            dropout_bits=cfg.attention_dropout_bits,
            interpret=cfg.attention_interpret,
        )
        out = nn.with_logical_constraint(out, BATCH_LENGTH_HEADS_KV)
        out = out.reshape(*x.shape[:-1], cfg.hidden_size)
        out = make_dense(
            cfg,
            cfg.hidden_size,
            name="output",
            kernel_axes=("joined_kv", "embed"),
            role="attention_output",
        )(out)
        return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)


class BertFeedForward(nn.Module):
    """Intermediate Dense, activation, output Dense."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        h = make_dense(
            cfg,
            cfg.intermediate_size,
            name="intermediate",
            kernel_axes=("embed", "mlp"),
            role="ffn_intermediate",
        )(x)
        h = nn.with_logical_constraint(activation(cfg.hidden_act, h), BATCH_LENGTH_MLP)
        out = make_dense(
            cfg, cfg.hidden_size, name="output", kernel_axes=("mlp", "embed"), role="ffn_output"
        )(h)
        return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)


class BertLayer(nn.Module):
    """One transformer layer: post-LN as in the original BERT, or pre-LN. `attention_bias` is
    the relative-position bias (or None)."""

    config: BertConfig

    @nn.compact
    def __call__(
        self, x: Array, segment_ids: Array, attention_bias: Array | None, deterministic: bool
    ) -> Array:
        cfg = self.config
        attn = BertSelfAttention(cfg, name="attention")
        ffn = BertFeedForward(cfg, name="ffn")
        attn_norm = make_layer_norm(cfg, "attention_layer_norm")
        ffn_norm = make_layer_norm(cfg, "ffn_layer_norm")
        drop = Dropout(cfg.hidden_dropout_rate)

        def sublayer(x, fn, norm):
            if cfg.pre_layer_norm:
                return x + drop(fn(norm(x)), deterministic=deterministic)
            return norm(x + drop(fn(x), deterministic=deterministic))

        x = sublayer(
            x,
            lambda y: attn(y, segment_ids, attention_bias, deterministic=deterministic),
            attn_norm,
        )
        x = sublayer(x, ffn, ffn_norm)
        return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)
