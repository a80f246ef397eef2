"""Counter-based attention-dropout masks: the keep decision for score (query i, key j) of one
(row, head) is a pure function of that pair's seed and (i, j), so a kernel computes it where it
needs it, forward and backward, and stores nothing.

    seeds = row_head_seeds(rng, batch, heads)  # int32 [batch, heads]
    keep = keep_mask(seeds[b, h], q_index, k_index, rate)  # broadcasts the indices

The bits are two rounds of murmur3's 32-bit finaliser in int32 arithmetic (wrapping multiplies,
logical shifts: ops Mosaic and Triton lower), the top 24 compared with a threshold: the mask keeps
`keep_rate(rate)`, the rate rounded to a multiple of 2^-24. It is a valid Bernoulli mask, not the
one `xla_attention` draws from the same key (another generator).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array

_BITS = 24  # compared with the threshold: int32 values, no unsigned comparison


def _int32(c: int) -> int:
    return int(np.uint32(c).view(np.int32))


_M1, _M2, _GOLDEN = _int32(0x85EBCA6B), _int32(0xC2B2AE35), _int32(0x9E3779B9)


def _fmix(x: Array) -> Array:
    """murmur3's finaliser: a bijection of 32-bit words in which every input bit flips each
    output bit with probability about 1/2."""
    x = x ^ lax.shift_right_logical(x, 16)
    x = x * _M1
    x = x ^ lax.shift_right_logical(x, 13)
    x = x * _M2
    return x ^ lax.shift_right_logical(x, 16)


def keep_threshold(rate: float) -> int:
    """The kept entries' count of 24-bit values for a dropout `rate`."""
    return round((1.0 - rate) * 2**_BITS)


def keep_rate(rate: float) -> float:
    """The fraction a mask for dropout `rate` keeps exactly (the output's scale)."""
    return keep_threshold(rate) / 2**_BITS


def row_head_seeds(rng: Array, batch: int, heads: int) -> Array:
    """One int32 seed per (row, head) from a key: sharded as the rows and heads are, each shard's
    masks differ from the others'."""
    return lax.bitcast_convert_type(jax.random.bits(rng, (batch, heads), jnp.uint32), jnp.int32)


def keep_mask(seed: Array, q_index: Array, k_index: Array, rate: float) -> Array:
    """Boolean keep decisions for the scores (q_index, k_index) (int32, broadcast together) of the
    (row, head) whose int32 `seed` is given; True with probability `keep_rate(rate)`."""
    x = _fmix(seed + q_index * _GOLDEN)
    x = _fmix(x ^ k_index)
    return lax.shift_right_logical(x, 32 - _BITS) < keep_threshold(rate)


def dropped(x: Array, seed: Array, q_index: Array, k_index: Array, rate: float) -> Array:
    """Scores `x` at (q_index, k_index) with the dropped zeroed and the kept scaled by 1/keep
    rate (the indices broadcast to x's shape)."""
    keep = keep_mask(seed, q_index, k_index, rate)
    return jnp.where(keep, x * (1.0 / keep_rate(rate)), 0.0)
