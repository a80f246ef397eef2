"""Flash attention over packed rows for GPU (Pallas, Triton) that skips the masked blocks.

One program per (query block, row, head) loops over the key/value blocks of its query block's
range (`block_ranges.kv_ranges`) and no others: a row of sequences l1..lk costs about the
sum of li^2, not L^2. Within the boundary blocks the segment mask applies as in
`segment_attention.xla_attention`; padding queries (segment 0) output zeros, and padding
keys are seen by no real query. The backward pass is two kernels: dq over the same ranges, dk
and dv one program per key block over the query blocks that see it (`q_ranges`). A sliding
`window` (`block_ranges`) narrows the ranges to the blocks within `window // 2` tokens and masks
the keys farther than that inside them.
Softmax statistics and accumulators are float32; q, k, v float32 or bfloat16.

    out = packed_attention(q, k, v, segment_ids)  # q, k, v [rows, L, heads, head_dim]
    out = packed_attention(q, k, v, segment_ids, interpret=True)  # any backend (tests)
    local = packed_attention(q, k, v, segment_ids, window=128)  # 64 tokens either side

Attention dropout (`dropout_rate` > 0, one int32 seed per row and head) drops probabilities by
`bert_flax.kernels.dropout_bits.keep_mask`, recomputed by the backward kernels (nothing stored);
at rate 0 the kernels hold no dropout code.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bert_flax.kernels import dropout_bits
from bert_flax.kernels.block_ranges import check_window, kv_ranges, q_ranges, within_window

Array = jax.Array

# Finite, so that a block all masked for some query gives exp2(mask - max) = 1, not NaN; the
# next block with a visible key rescales it away (its correction exp2(mask - max) is 0).
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Tile sizes: `q` x `k` for the forward pass, `q_bwd` x `k_bwd` for both backward kernels.
    Each must divide the row length; Triton needs powers of two of at least 16."""

    q: int = 128
    k: int = 64
    q_bwd: int = 64
    k_bwd: int = 64


def packed_attention(
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array,
    *,
    blocks: Blocks = Blocks(),
    window: int | None = None,
    dropout_rate: float = 0.0,
    seeds: Array | None = None,
    interpret: bool = False,
) -> Array:
    """Softmax attention of q, k, v [rows, L, heads, head_dim] within the sequences of
    `segment_ids` [rows, L] (1..k, 0 for padding), scaled by head_dim ** -0.5; zero at padding.
    `window` (a positive even number of tokens; None: global) lets a query see only the keys
    within `window // 2` tokens of it. `dropout_rate` > 0 drops probabilities by
    `dropout_bits.keep_mask` of `seeds` (int32 [rows, heads], `dropout_bits.row_head_seeds`)."""
    check_window(window)
    length = q.shape[1]
    for size in dataclasses.astuple(blocks):
        if length % size:
            raise ValueError(f"Row length {length} is not a multiple of the kernel block {size}.")
    if dropout_rate and seeds is None:
        raise ValueError("Attention dropout needs seeds (dropout_bits.row_head_seeds).")
    settings = _Settings(dropout_rate, window, interpret)
    return _attention(q, k, v, segment_ids, seeds, blocks, settings)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The kernels' static settings besides the blocks: the dropout rate (0: no dropout code),
    the sliding window (None: global, no window code) and interpret mode."""

    rate: float
    window: int | None
    interpret: bool


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, segment_ids, seeds, blocks: Blocks, settings: _Settings) -> Array:
    return _forward(q, k, v, segment_ids, seeds, blocks, settings)[0]


def _attention_fwd(q, k, v, segment_ids, seeds, blocks, settings):
    out, lse = _forward(q, k, v, segment_ids, seeds, blocks, settings)
    return out, (q, k, v, segment_ids, seeds, out, lse)


def _attention_bwd(blocks, settings, residuals, d_out):
    q, k, v, segment_ids, seeds, out, lse = residuals
    # delta_i = sum_j p_ij dp_ij = <o_i, do_i>, the softmax backward's row term (with dropout
    # too: dp the dropped dp's masked and scaled entries, o the dropped p's).
    delta = jnp.einsum("blhd,blhd->bhl", out.astype(jnp.float32), d_out.astype(jnp.float32))
    dq = _backward_dq(q, k, v, segment_ids, seeds, d_out, lse, delta, blocks, settings)
    dk, dv = _backward_dkv(q, k, v, segment_ids, seeds, d_out, lse, delta, blocks, settings)
    return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


# The kernels work in base 2: logits times log2(e), so exp2 and log2 (cheaper on GPUs) give the
# natural softmax; `lse` is the base-2 log-sum-exp.


def _scale(head_dim: int) -> float:
    return head_dim**-0.5


def _padded(head_dim: int) -> int:
    return pl.next_power_of_2(head_dim)


def _load(ref, head_dim: int) -> Array:
    """A [block, padded head_dim] tile, zero beyond `head_dim` (Triton tiles are powers of 2)."""
    return plgpu.load(ref, mask=(jnp.arange(ref.shape[-1]) < head_dim)[None, :], other=0.0)


def _store(ref, value: Array, head_dim: int) -> None:
    plgpu.store(ref, value.astype(ref.dtype), mask=(jnp.arange(ref.shape[-1]) < head_dim)[None])


def _logits2(q: Array, k: Array, head_dim: int) -> Array:
    """[block_q, block_k] float32 logits in base-2 units."""
    return plgpu.dot(q, k, trans_b=True) * (_scale(head_dim) * math.log2(math.e))


def _visible(q_segments: Array, k_segments: Array, window, q_block, k_block) -> Array:
    """[block_q, block_k]: True where a real query of block `q_block` and a key of block
    `k_block` share a segment, within `window` (None: global, no window code) of each other."""
    same = q_segments[:, None] == k_segments[None, :]
    visible = same & (q_segments != 0)[:, None]
    if window is None:
        return visible
    block_q, block_k = q_segments.size, k_segments.size
    indices = _indices(block_q, block_k, q_block * block_q, k_block * block_k)
    return visible & within_window(*indices, window)


def _indices(block_q: int, block_k: int, q_start, k_start) -> tuple[Array, Array]:
    """The row's query indices [block_q, 1] and key indices [1, block_k] of a tile."""
    q_index = q_start + jnp.arange(block_q, dtype=jnp.int32)[:, None]
    return q_index, k_start + jnp.arange(block_k, dtype=jnp.int32)[None, :]


def _probs(q, k, lse, visible: Array, head_dim: int) -> Array:
    """The softmax probabilities of a tile, recomputed from the forward pass's log-sum-exp;
    exactly zero where not `visible` (padding queries' `lse` is meaningless)."""
    p = jnp.exp2(_logits2(q, k, head_dim) - lse[:, None])
    return jnp.where(visible, p, 0.0)


def _split_seed(refs, rate: float):
    """This program's dropout seed (None without dropout) and the kernel's other refs."""
    return (refs[0][...], refs[1:]) if rate else (None, refs)


def _drop(x: Array, seed, rate: float, q_start, k_start) -> Array:
    """`dropout_bits.dropped` of a [block_q, block_k] tile from query `q_start`, key `k_start`."""
    return dropout_bits.dropped(x, seed, *_indices(*x.shape, q_start, k_start), rate)


def _forward_kernel(lo_ref, hi_ref, seg_ref, *refs, block_k, head_dim, rate, window):
    seed, (q_ref, k_ref, v_ref, o_ref, lse_ref) = _split_seed(refs, rate)
    block_q = q_ref.shape[0]
    q = _load(q_ref, head_dim)
    q_block = pl.program_id(0)
    q_start = q_block * block_q
    q_segments = seg_ref[pl.ds(q_start, block_q)]

    def visit(j, carry):
        o, m, total = carry
        keys = pl.ds(j * block_k, block_k)
        logits = _logits2(q, _load(k_ref.at[keys], head_dim), head_dim)
        visible = _visible(q_segments, seg_ref[keys], window, q_block, j)
        logits = jnp.where(visible, logits, _MASK_VALUE)
        m_next = jnp.maximum(m, logits.max(-1))
        correction = jnp.exp2(m - m_next)
        p = jnp.exp2(logits - m_next[:, None])
        v = _load(v_ref.at[keys], head_dim)
        total = correction * total + p.sum(-1)
        if rate:
            p = _drop(p, seed, rate, q_start, j * block_k)
        o = correction[:, None] * o + plgpu.dot(p.astype(v.dtype), v)
        return o, m_next, total

    init = (
        jnp.zeros((block_q, q_ref.shape[-1]), jnp.float32),
        jnp.full((block_q,), -jnp.inf, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
    )
    o, m, total = jax.lax.fori_loop(lo_ref[...], hi_ref[...], visit, init)
    real = q_segments != 0
    total = jnp.where(real, total, 1.0)  # padding queries, possibly in an empty range: no 0 / 0
    _store(o_ref, jnp.where(real[:, None], o / total[:, None], 0.0), head_dim)
    lse_ref[...] = m + jnp.log2(total)


def _dq_kernel(lo_ref, hi_ref, seg_ref, *refs, block_k, head_dim, rate, window):
    seed, (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref) = _split_seed(refs, rate)
    block_q = q_ref.shape[0]
    q, do = _load(q_ref, head_dim), _load(do_ref, head_dim)
    q_block = pl.program_id(0)
    q_start = q_block * block_q
    q_segments = seg_ref[pl.ds(q_start, block_q)]
    lse, delta = lse_ref[...], delta_ref[...]

    def visit(j, dq):
        keys = pl.ds(j * block_k, block_k)
        k, v = _load(k_ref.at[keys], head_dim), _load(v_ref.at[keys], head_dim)
        visible = _visible(q_segments, seg_ref[keys], window, q_block, j)
        p = _probs(q, k, lse, visible, head_dim)
        dp = plgpu.dot(do, v, trans_b=True)
        if rate:
            dp = _drop(dp, seed, rate, q_start, j * block_k)
        ds = p * (dp - delta[:, None])
        return dq + plgpu.dot(ds.astype(k.dtype), k)

    dq = jnp.zeros((block_q, q_ref.shape[-1]), jnp.float32)
    dq = jax.lax.fori_loop(lo_ref[...], hi_ref[...], visit, dq)
    _store(dq_ref, dq * _scale(head_dim), head_dim)


def _dkv_kernel(lo_ref, hi_ref, seg_ref, *refs, block_q, head_dim, rate, window):
    seed, refs = _split_seed(refs, rate)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref = refs
    block_k = k_ref.shape[0]
    k, v = _load(k_ref, head_dim), _load(v_ref, head_dim)
    k_block = pl.program_id(0)
    k_start = k_block * block_k
    k_segments = seg_ref[pl.ds(k_start, block_k)]

    def visit(i, carry):
        dk, dv = carry
        queries = pl.ds(i * block_q, block_q)
        q, do = _load(q_ref.at[queries], head_dim), _load(do_ref.at[queries], head_dim)
        visible = _visible(seg_ref[queries], k_segments, window, i, k_block)
        p = _probs(q, k, lse_ref[queries], visible, head_dim)
        dp = plgpu.dot(do, v, trans_b=True)
        dropped = p
        if rate:
            dropped = _drop(p, seed, rate, i * block_q, k_start)
            dp = _drop(dp, seed, rate, i * block_q, k_start)
        dv = dv + plgpu.dot(dropped.astype(do.dtype), do, trans_a=True)
        ds = p * (dp - delta_ref[queries][:, None])
        return dk + plgpu.dot(ds.astype(q.dtype), q, trans_a=True), dv

    zeros = jnp.zeros((block_k, k_ref.shape[-1]), jnp.float32)
    dk, dv = jax.lax.fori_loop(lo_ref[...], hi_ref[...], visit, (zeros, zeros))
    _store(dk_ref, dk * _scale(head_dim), head_dim)
    _store(dv_ref, dv, head_dim)


# BlockSpecs over the grid (block index along the length, row, head).


def _tile_spec(block: int, head_dim: int) -> pl.BlockSpec:
    """A [block, head_dim] tile of one row and head of a [rows, L, heads, head_dim] array."""
    return pl.BlockSpec((None, block, None, _padded(head_dim)), lambda i, b, h: (b, i, h, 0))


def _whole_spec(length: int, head_dim: int) -> pl.BlockSpec:
    """The whole length of one row and head, for the kernels' inner loops to slice."""
    return pl.BlockSpec((None, length, None, _padded(head_dim)), lambda i, b, h: (b, 0, h, 0))


def _range_spec() -> pl.BlockSpec:
    """One int32 of a [rows, blocks] range bound: this program's."""
    return pl.BlockSpec((None, None), lambda i, b, h: (b, i))


def _row_spec(length: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, length), lambda i, b, h: (b, 0))


def _stats_spec(block: int | None, length: int) -> pl.BlockSpec:
    """lse or delta [rows, heads, L]: this program's `block`, or the whole length (None)."""
    if block is None:
        return pl.BlockSpec((None, None, length), lambda i, b, h: (b, h, 0))
    return pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, i))


def _call(kernel, name: str, grid, in_specs, out_specs, out_shape, head_dim, settings, *args):
    """`kernel` on `args`: the dropout seeds (passed on after the segment ids where
    `settings.rate` > 0, else dropped), the ranges, the segment ids, the rest."""
    seeds, *args = args
    if settings.rate:
        in_specs = [*in_specs[:3], pl.BlockSpec((None, None), lambda i, b, h: (b, h)),
                    *in_specs[3:]]  # fmt: skip
        args = [*args[:3], seeds, *args[3:]]
    return pl.pallas_call(
        functools.partial(kernel, head_dim=head_dim, rate=settings.rate, window=settings.window),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2),
        interpret=settings.interpret,
        name=name,
    )(*args)


def _forward(q, k, v, segment_ids, seeds, blocks: Blocks, settings) -> tuple[Array, Array]:
    rows, length, heads, head_dim = q.shape
    lo, hi = kv_ranges(segment_ids, blocks.q, blocks.k, settings.window)
    tile, whole = _tile_spec(blocks.q, head_dim), _whole_spec(length, head_dim)
    lse = jax.ShapeDtypeStruct((rows, heads, length), jnp.float32)
    return _call(
        functools.partial(_forward_kernel, block_k=blocks.k),
        "packed_attention_fwd",
        (length // blocks.q, rows, heads),
        [_range_spec(), _range_spec(), _row_spec(length), tile, whole, whole],
        [tile, _stats_spec(blocks.q, length)],
        [jax.ShapeDtypeStruct(q.shape, q.dtype), lse],
        head_dim,
        settings,
        seeds, lo, hi, segment_ids, q, k, v,
    )  # fmt: skip


def _backward_dq(q, k, v, segment_ids, seeds, d_out, lse, delta, blocks, settings) -> Array:
    rows, length, heads, head_dim = q.shape
    lo, hi = kv_ranges(segment_ids, blocks.q_bwd, blocks.k_bwd, settings.window)
    tile, whole = _tile_spec(blocks.q_bwd, head_dim), _whole_spec(length, head_dim)
    stats = _stats_spec(blocks.q_bwd, length)
    return _call(
        functools.partial(_dq_kernel, block_k=blocks.k_bwd),
        "packed_attention_dq",
        (length // blocks.q_bwd, rows, heads),
        [_range_spec(), _range_spec(), _row_spec(length), tile, whole, whole, tile, stats, stats],
        tile,
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        head_dim,
        settings,
        seeds, lo, hi, segment_ids, q, k, v, d_out, lse, delta,
    )  # fmt: skip


def _backward_dkv(q, k, v, segment_ids, seeds, d_out, lse, delta, blocks, settings) -> tuple:
    rows, length, heads, head_dim = q.shape
    lo, hi = q_ranges(segment_ids, blocks.q_bwd, blocks.k_bwd, settings.window)
    tile, whole = _tile_spec(blocks.k_bwd, head_dim), _whole_spec(length, head_dim)
    stats = _stats_spec(None, length)
    return _call(
        functools.partial(_dkv_kernel, block_q=blocks.q_bwd),
        "packed_attention_dkv",
        (length // blocks.k_bwd, rows, heads),
        [_range_spec(), _range_spec(), _row_spec(length), whole, tile, tile, whole, stats, stats],
        [tile, tile],
        [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        head_dim,
        settings,
        seeds, lo, hi, segment_ids, q, k, v, d_out, lse, delta,
    )  # fmt: skip
