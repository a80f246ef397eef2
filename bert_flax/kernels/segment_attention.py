"""Multi-head attention restricted to tokens of the same packed sequence, with XLA.

Every attention back end (`bert_flax.model.attention.BACKENDS`) applies the same rule: query i
may attend to key j iff `segment_ids[i] == segment_ids[j]`. Real tokens (ids 1..k) therefore see
only their own sequence; padding (id 0) sees only padding, so no softmax row is ever empty (no
NaN), and the outputs at padding positions are zeroed afterwards. `xla_attention`, the reference
of every kernel, also takes a sliding `window` (`bert_flax.kernels.block_ranges`): query i then
sees key j only within `|i - j| <= window // 2` as well.

Shapes: q, k, v are [batch, length, heads, head_dim]; segment_ids is [batch, length]; an
optional additive `bias` on the logits broadcasts to [batch, heads, length, length] (the
relative-position bias of `bert_flax.model.layers.RelativePositionBias`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bert_flax.kernels import block_ranges

Array = jax.Array

# Finite, so masked logits never produce inf - inf in the softmax.
_MASK_VALUE = -1e10


def segment_mask(segment_ids: Array) -> Array:
    """Boolean [batch, 1, q_len, kv_len] mask: True where both tokens share a segment id."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


def zero_padding(out: Array, segment_ids: Array) -> Array:
    """`out` [batch, length, heads, head_dim] with zeros at the padding tokens (segment 0)."""
    return jnp.where((segment_ids != 0)[:, :, None, None], out, jnp.zeros((), out.dtype))


def xla_attention(
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    bias: Array | None = None,
    dropout_head_groups: int = 0,
    dropout_bits: int = 32,
    window: int | None = None,
) -> Array:
    """Dense-mask attention as two einsums; logits and softmax in float32. Works everywhere.
    `window` (None: global) masks the keys farther than `window // 2` tokens from the query.

    `dropout_head_groups` g > 0 draws g attention-dropout masks per row, each shared by
    heads/g consecutive heads (0: one per head, as BERT), cutting the random bits g/heads-fold.
    `dropout_bits` 8 draws each mask entry from one byte instead of a 32-bit word
    (`dropout_keep_mask`).
    """
    block_ranges.check_window(window)
    scale = q.shape[-1] ** -0.5
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    if bias is not None:
        logits = logits + bias
    mask = segment_mask(segment_ids)
    if window is not None:
        position = jnp.arange(q.shape[1], dtype=jnp.int32)
        mask &= block_ranges.within_window(position[:, None], position[None, :], window)
    logits = jnp.where(mask, logits, _MASK_VALUE)
    probs = jax.nn.softmax(logits, axis=-1)
    if not deterministic and dropout_rate > 0.0:
        if dropout_rng is None:
            raise ValueError("Attention dropout needs a dropout_rng when deterministic=False.")
        keep, keep_rate = dropout_keep_mask(
            dropout_rng, 1.0 - dropout_rate, probs.shape, dropout_head_groups, dropout_bits
        )
        probs = jnp.where(keep, probs / keep_rate, 0.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
    return zero_padding(out, segment_ids)


def byte_keep_threshold(keep_rate: float) -> int:
    """The keep rate as a count of byte values: an entry is kept where its random byte is below
    it, so 8-bit masks keep `threshold / 256` (0.9 becomes 230 / 256 = 0.8984)."""
    threshold = round(keep_rate * 256)
    if not 0 < threshold < 256:
        raise ValueError(
            f"A dropout rate of {1 - keep_rate:g} keeps {threshold}/256 with 8-bit masks, which "
            "they cannot draw (they can draw rates strictly between 1/512 and 1 - 1/512); use "
            "32-bit masks (attention_dropout_bits=32)."
        )
    return threshold


def _keep_mask_and_rate(
    rng: Array, keep_rate: float, shape: tuple, bits: int
) -> tuple[Array, float]:
    """A keep mask of `shape` and the rate it keeps; 8 bits: four entries per 32-bit word, each
    from one of its bytes (as FlashAttention's dropout does), so a quarter of the draws."""
    if bits == 32:
        return jax.random.bernoulli(rng, keep_rate, shape), keep_rate
    threshold = byte_keep_threshold(keep_rate)
    *lead, last = shape
    words = jax.random.bits(rng, (*lead, -(-last // 4)), jnp.uint32)
    random_bytes = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(*lead, -1)[..., :last]
    return random_bytes < threshold, threshold / 256


def dropout_keep_mask(
    rng: Array, keep_rate: float, shape: tuple, head_groups: int, bits: int = 32
) -> tuple[Array, float]:
    """A Bernoulli keep mask of `shape` [batch, heads, q, k] and its exact keep rate (the scale
    that keeps the output unbiased). With `head_groups` g > 0 only [batch, g, q, k] draws, each
    broadcast over its group of heads/g heads; `bits` 32 draws one 32-bit word per entry
    (`jax.random.bernoulli`), 8 one byte, the keep rate rounded to a multiple of 1/256."""
    if not head_groups:
        return _keep_mask_and_rate(rng, keep_rate, shape, bits)
    batch, heads, *rest = shape
    keep, keep_rate = _keep_mask_and_rate(rng, keep_rate, (batch, head_groups, 1, *rest), bits)
    keep = jnp.broadcast_to(keep, (batch, head_groups, heads // head_groups, *rest))
    return keep.reshape(shape), keep_rate


def jax_nn_attention(
    q: Array, k: Array, v: Array, segment_ids: Array, *, implementation: str
) -> Array:
    """`jax.nn.dot_product_attention` with the segment mask; `implementation` "cudnn" (GPU, with
    bfloat16/float16 inputs) or "xla" (the reference implementation of the same API)."""
    out = jax.nn.dot_product_attention(
        q, k, v, mask=segment_mask(segment_ids), implementation=implementation
    )
    return zero_padding(out, segment_ids)
