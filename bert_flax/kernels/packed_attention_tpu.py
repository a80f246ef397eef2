"""Flash attention for packed rows on TPU (Pallas, Mosaic) that visits only the blocks where
queries and keys of one sequence meet.

A grid step takes one query block and loops over the key/value blocks its sequences span
(`kv_ranges`, computed once a row and prefetched into SMEM as scalars): a skipped block costs
nothing, not even a grid step. The row's keys and values stay in VMEM for all of a (row, head)'s
query blocks, so each is read from HBM once. The backward pass does the same twice: dQ over each
query block's kv range, dK and dV over each kv block's query range (`q_ranges`), with the row's
queries, output gradients and softmax statistics in VMEM. Within a visited block the segment mask
applies: query i sees key j iff both hold the same non-zero segment id; padding (id 0) sees
nothing and its outputs (and the gradients through them) are zero, as `xla_attention`'s.
A sliding `window` (`block_ranges`) narrows the ranges to the blocks within `window // 2` tokens
and masks the keys farther than that inside them.

    out = packed_attention(q, k, v, segment_ids)  # [batch, length, heads, head_dim] each
    local = packed_attention(q, k, v, segment_ids, window=128)  # 64 tokens either side

Attention dropout (`dropout_rate` > 0, one int32 seed per row and head) drops probabilities by a
counter-based mask (`bert_flax.kernels.dropout_bits`) that the backward kernels recompute: nothing
is stored; at rate 0 the kernels hold no dropout code. Logits, softmax and accumulators are
float32; products take the inputs' dtype. No logit bias. `interpret=True` runs it on any backend
(slow: tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bert_flax.kernels import dropout_bits
from bert_flax.kernels.block_ranges import (
    check_block_sizes,
    check_window,
    kv_ranges,
    q_ranges,
    within_window,
)

Array = jax.Array

LANES = 128
SUBLANES = 8
# Finite, so a row whose keys are all masked never computes inf - inf.
_MASK_VALUE = -1e10
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b
# The most scoped VMEM a kernel asks for: within every TPU this project targets (v5e, v5p, v6e
# hold 95 MiB or more a core).
_VMEM_LIMIT = 64 * 2**20


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Query and key/value block sizes (tokens), and whether to run in interpret mode."""

    q: int = 128
    k: int = 128
    interpret: bool = False


def check_tpu_blocks(length: int, block_q: int, block_k: int) -> None:
    """ValueError, naming the fix, unless the blocks divide `length` and fill whole lanes."""
    check_block_sizes(length, block_q, block_k)
    if block_q % LANES or block_k % LANES:
        raise ValueError(
            f"The TPU packed attention kernel needs block sizes that are multiples of {LANES} "
            f"(the lane width), got block_q={block_q}, block_k={block_k}."
        )


def packed_attention(
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array,
    *,
    block_q: int = 128,
    block_k: int = 128,
    window: int | None = None,
    dropout_rate: float = 0.0,
    seeds: Array | None = None,
    interpret: bool = False,
) -> Array:
    """Attention within each packed sequence, skipping the blocks no sequence spans.

    q, k, v: [batch, length, heads, head_dim]; segment_ids: int32 [batch, length], each
    sequence one contiguous run of its id, 0 padding. Returns [batch, length, heads, head_dim]
    in v's dtype, zero at padding. `length` must be a multiple of both block sizes, which must
    be multiples of 128. `window` (a positive even number of tokens; None: global) lets a query
    see only the keys within `window // 2` tokens of it. `dropout_rate` > 0 drops attention
    probabilities by `dropout_bits.keep_mask` of `seeds` (int32 [batch, heads],
    `dropout_bits.row_head_seeds`).
    """
    check_window(window)
    check_tpu_blocks(q.shape[1], block_q, block_k)
    _check_vmem(q.shape[1], q.shape[3], q.dtype)
    if dropout_rate and seeds is None:
        raise ValueError("Attention dropout needs seeds (dropout_bits.row_head_seeds).")
    heads_major = lambda x: x.transpose(0, 2, 1, 3)  # the kernels' [batch, heads, length, dim]
    blocks = Blocks(block_q, block_k, interpret)
    seeds = seeds.reshape(-1) if dropout_rate else jnp.zeros((0,), jnp.int32)
    q, k, v = heads_major(q), heads_major(k), heads_major(v)
    out = _attention(q, k, v, segment_ids, seeds, blocks, dropout_rate, window)
    return heads_major(out)


def _vmem_bytes(length: int, head_dim: int, dtype) -> int:
    """The VMEM a kernel needs, double-buffered: two operands of a whole row ([length, head_dim],
    as K and V), three per-token values of the row (ids, logsumexp, D: [8, length], 4 bytes), and
    8 MiB for a block's own operands, scratch and temporaries."""
    whole_rows = 2 * length * head_dim * jnp.dtype(dtype).itemsize
    per_token = 3 * SUBLANES * length * 4
    return 2 * (whole_rows + per_token) + 8 * 2**20


def _check_vmem(length: int, head_dim: int, dtype) -> None:
    need = _vmem_bytes(length, head_dim, dtype)
    if need > _VMEM_LIMIT:
        raise ValueError(
            f"The TPU packed attention kernel keeps a row's keys and values in VMEM: rows of "
            f"{length} tokens with head_dim={head_dim} in {jnp.dtype(dtype).name} need "
            f"{need / 2**20:.0f} MiB, more than {_VMEM_LIMIT // 2**20} MiB; use shorter rows, "
            "bfloat16 activations (model.dtype), or attention_impl='splash'."
        )


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attention(q, k, v, segment_ids, seeds, blocks: Blocks, rate: float, window) -> Array:
    return _forward(q, k, v, segment_ids, seeds, blocks, rate, window)[0]


def _attention_fwd(q, k, v, segment_ids, seeds, blocks, rate, window):
    out, lse = _forward(q, k, v, segment_ids, seeds, blocks, rate, window)
    return out, (q, k, v, segment_ids, seeds, out, lse)


def _attention_bwd(blocks, rate, window, residuals, d_out):
    q, k, v, segment_ids, seeds, out, lse = residuals
    # D_i = sum_j P_ij dP_ij = dO_i . O_i: one product per query, before the kernels (with
    # dropout too: dP is then the dropped dP's masked and scaled entries, and O the dropped P's).
    di = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)
    lse, di = (_blocks_along_lanes(x, blocks.q) for x in (lse, di))
    dq = _backward_dq(q, k, v, segment_ids, d_out, lse, di, seeds, blocks, rate, window)
    dk, dv = _backward_dkv(q, k, v, segment_ids, d_out, lse, di, seeds, blocks, rate, window)
    return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


# Layouts. The block a grid step owns holds one token a row; its segment ids come repeated over
# 128 lanes. The blocks a step loops over come whole for the row, with the block index leading
# (so the loop indexes it dynamically without slicing a tiled dimension). Other per-token values
# (segment ids of those blocks, logsumexp, D) lie one token a column, in blocks repeated over 8
# sublanes (16 times fewer bytes than 128 lanes); the dQ kernel, which needs its logsumexp and D
# one a row, transposes its block.
def _along_sublanes(x: Array) -> Array:  # [..., length] -> [..., length, 128]
    return jnp.broadcast_to(x[..., None], (*x.shape, LANES))


def _blocks_along_lanes(x: Array, block: int) -> Array:  # [..., L] -> [..., L/block, 8, block]
    x = x.reshape(*x.shape[:-1], -1, 1, block)
    return jnp.broadcast_to(x, (*x.shape[:-2], SUBLANES, block))


def _blocks(x: Array, block: int) -> Array:  # [b, h, L, d] -> [b, h, L/block, block, d]
    batch, heads, length, dim = x.shape
    return x.reshape(batch, heads, length // block, block, dim)


def _per_query_block(bq: int) -> pl.BlockSpec:
    """Query block i's [8, bq] of values laid out by `_blocks_along_lanes` [b, h, L/bq, 8, bq]."""
    return pl.BlockSpec((None, None, None, SUBLANES, bq), lambda b, h, i, *_: (b, h, i, 0, 0))


def _widen(x: Array, width: int) -> Array:
    """[rows, 128] lane-repeated values as [rows, width]."""
    return jnp.tile(x, (1, pl.cdiv(width, LANES)))[:, :width]


def _visible(row_ids: Array, col_ids: Array) -> Array:
    """[rows, cols] mask from row ids [rows, 128] (lane-repeated) and column ids [1, cols]:
    the same sequence, not padding."""
    row_ids = _widen(row_ids, col_ids.shape[1])
    return (row_ids == col_ids) & (row_ids != 0)


def _call(kernel, name, grid, in_specs, out_specs, out_shape, scratch, blocks, seeds, *args):
    """`kernel` over `grid` (batch, heads, blocks), with the ranges' two arrays (and the dropout
    `seeds`, unless empty) prefetched before `args`; the block loop runs in order within a (row,
    head), so the row's whole operands are fetched once for all its blocks."""
    prefetch = 2 + bool(seeds.size)
    if seeds.size:
        args = (*args[:2], seeds, *args[2:])
    q = args[prefetch]  # [batch, heads, ..., head_dim] in every kernel
    vmem = _vmem_bytes(math.prod(q.shape[2:-1]), q.shape[-1], q.dtype)
    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=prefetch,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=scratch,
        ),
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=max(vmem, 32 * 2**20),
        ),
        name=name,
        interpret=blocks.interpret,
    )
    with jax.named_scope(name):  # the op's name in the HLO: the profiler finds it by it
        return call(*args)


def _for_each_block(first_ref, stop_ref, body) -> None:
    """`body(block)` for the blocks of the range of grid step (row, ·, block)."""
    step = pl.program_id(0) * pl.num_programs(2) + pl.program_id(2)

    def loop_body(block, carry):
        body(block)
        return carry

    lax.fori_loop(first_ref[step], stop_ref[step], loop_body, 0)


def _split_seed(refs, rate: float):
    """The grid step's (row, head) dropout seed (None without dropout) and the kernel's other
    refs. Read outside the block loop: interpret mode takes program ids only there."""
    if not rate:
        return None, refs
    return refs[0][pl.program_id(0) * pl.num_programs(1) + pl.program_id(1)], refs[1:]


def _indices(shape, q_start, k_start, q_axis: int) -> tuple[Array, Array]:
    """The query and key indices in the row of a [rows, cols] tile of scores, queries from
    `q_start` along `q_axis` and keys from `k_start` along the other."""
    q_index = q_start + lax.broadcasted_iota(jnp.int32, shape, q_axis)
    return q_index, k_start + lax.broadcasted_iota(jnp.int32, shape, 1 - q_axis)


def _dropped(x: Array, seed: Array, rate: float, q_start, k_start, q_axis: int = 0) -> Array:
    """x [rows, cols] of scores (laid out as `_indices` says) with the dropped entries zeroed and
    the kept scaled by 1/keep rate."""
    return dropout_bits.dropped(x, seed, *_indices(x.shape, q_start, k_start, q_axis), rate)


def _windowed(visible: Array, window, q_block, k_block, q_axis: int = 0) -> Array:
    """`visible` [rows, cols], query block `q_block`'s scores (along `q_axis`) against key block
    `k_block`'s, within the sliding `window`; None: all of it (no window code)."""
    if window is None:
        return visible
    q_start = q_block * visible.shape[q_axis]
    k_start = k_block * visible.shape[1 - q_axis]
    return visible & within_window(*_indices(visible.shape, q_start, k_start, q_axis), window)


def _forward_kernel(first_ref, stop_ref, *refs, scale: float, rate: float, window):
    seed, refs = _split_seed(refs, rate)
    block = pl.program_id(2)
    q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref = refs
    bq, bk = q_ref.shape[0], k_ref.shape[1]
    m_ref[...] = jnp.full_like(m_ref, _MASK_VALUE)
    l_ref[...] = jnp.zeros_like(l_ref)
    acc_ref[...] = jnp.zeros_like(acc_ref)
    q, q_ids = q_ref[...], q_ids_ref[...]

    def accumulate(c):
        k, v = k_ref[c], v_ref[c]
        s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * scale
        visible = _windowed(_visible(q_ids, k_ids_ref[c, :1, :]), window, block, c)
        s = jnp.where(visible, s, _MASK_VALUE)
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        # Masked entries are zeroed, not only made small: a query whose keys in this block are
        # all masked (padding, or another sequence) adds nothing.
        p = jnp.where(visible, jnp.exp(s - _widen(m_next, s.shape[1])), 0.0)
        alpha = jnp.exp(m_prev - m_next)
        m_ref[...] = m_next
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
        if rate:
            p = _dropped(p, seed, rate, block * bq, c * bk)
        pv = lax.dot_general(p.astype(v.dtype), v, _NN, preferred_element_type=jnp.float32)
        acc_ref[...] = acc_ref[...] * _widen(alpha, acc_ref.shape[1]) + pv

    _for_each_block(first_ref, stop_ref, accumulate)
    total = l_ref[...]
    seen = total > 0  # False for padding queries: output 0
    total = jnp.where(seen, total, 1.0)
    o_ref[...] = (acc_ref[...] / _widen(total, acc_ref.shape[1])).astype(o_ref.dtype)
    lse = jnp.where(seen, m_ref[...] + jnp.log(total), 0.0)
    lse_ref[...] = lse.T[:SUBLANES]


def _forward(
    q, k, v, segment_ids, seeds, blocks: Blocks, rate: float, window
) -> tuple[Array, Array]:
    """The output [batch, heads, length, head_dim] and the logsumexp [batch, heads, length]."""
    batch, heads, length, head_dim = q.shape
    bq, bk = blocks.q, blocks.k
    first, stop = (r.reshape(-1) for r in kv_ranges(segment_ids, bq, bk, window))
    q_block = pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i, *_: (b, h, i, 0))
    row = pl.BlockSpec(
        (None, None, length // bk, bk, head_dim), lambda b, h, i, *_: (b, h, 0, 0, 0)
    )
    out, lse = _call(
        functools.partial(_forward_kernel, scale=head_dim**-0.5, rate=rate, window=window),
        "packed_attention_fwd",
        (batch, heads, length // bq),
        [
            q_block, row, row,
            pl.BlockSpec((None, bq, LANES), lambda b, h, i, *_: (b, i, 0)),
            pl.BlockSpec((None, length // bk, SUBLANES, bk), lambda b, h, i, *_: (b, 0, 0, 0)),
        ],
        [q_block, _per_query_block(bq)],
        [
            jax.ShapeDtypeStruct(q.shape, v.dtype),
            jax.ShapeDtypeStruct((batch, heads, length // bq, SUBLANES, bq), jnp.float32),
        ],
        [
            pltpu.VMEM((bq, LANES), jnp.float32),
            pltpu.VMEM((bq, LANES), jnp.float32),
            pltpu.VMEM((bq, head_dim), jnp.float32),
        ],
        blocks, seeds,
        first, stop, q, _blocks(k, bk), _blocks(v, bk), _along_sublanes(segment_ids),
        _blocks_along_lanes(segment_ids, bk),
    )  # fmt: skip
    return out, lse[..., 0, :].reshape(batch, heads, length)


def _dq_kernel(first_ref, stop_ref, *refs, scale: float, rate: float, window):
    seed, refs = _split_seed(refs, rate)
    block = pl.program_id(2)
    q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, q_ids_ref, k_ids_ref, dq_ref, acc_ref = refs
    bq, bk = q_ref.shape[0], k_ref.shape[1]
    acc_ref[...] = jnp.zeros_like(acc_ref)
    q, do, q_ids = q_ref[...], do_ref[...], q_ids_ref[...]
    lse, di = (ref[...].T[:, :1] for ref in (lse_ref, di_ref))  # [bq, 1]

    def accumulate(c):
        k, v = k_ref[c], v_ref[c]
        s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * scale
        visible = _windowed(_visible(q_ids, k_ids_ref[c, :1, :]), window, block, c)
        p = jnp.where(visible, jnp.exp(s - lse), 0.0)
        dp = lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
        if rate:
            dp = _dropped(dp, seed, rate, block * bq, c * bk)
        ds = p * (dp - di)
        acc_ref[...] += lax.dot_general(
            ds.astype(k.dtype), k, _NN, preferred_element_type=jnp.float32
        )

    _for_each_block(first_ref, stop_ref, accumulate)
    dq_ref[...] = (acc_ref[...] * scale).astype(dq_ref.dtype)


def _backward_dq(
    q, k, v, segment_ids, d_out, lse, di, seeds, blocks: Blocks, rate, window
) -> Array:
    batch, heads, length, head_dim = q.shape
    bq, bk = blocks.q, blocks.k
    first, stop = (r.reshape(-1) for r in kv_ranges(segment_ids, bq, bk, window))
    q_block = pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i, *_: (b, h, i, 0))
    per_query = _per_query_block(bq)
    row = pl.BlockSpec(
        (None, None, length // bk, bk, head_dim), lambda b, h, i, *_: (b, h, 0, 0, 0)
    )
    return _call(
        functools.partial(_dq_kernel, scale=head_dim**-0.5, rate=rate, window=window),
        "packed_attention_dq",
        (batch, heads, length // bq),
        [
            q_block, row, row, q_block, per_query, per_query,
            pl.BlockSpec((None, bq, LANES), lambda b, h, i, *_: (b, i, 0)),
            pl.BlockSpec((None, length // bk, SUBLANES, bk), lambda b, h, i, *_: (b, 0, 0, 0)),
        ],
        q_block,
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        [pltpu.VMEM((bq, head_dim), jnp.float32)],
        blocks, seeds,
        first, stop, q, _blocks(k, bk), _blocks(v, bk), d_out, lse, di,
        _along_sublanes(segment_ids), _blocks_along_lanes(segment_ids, bk),
    )  # fmt: skip


def _dkv_kernel(first_ref, stop_ref, *refs, scale: float, rate: float, window):
    seed, refs = _split_seed(refs, rate)
    block = pl.program_id(2)
    q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, k_ids_ref, q_ids_ref, *outs = refs
    dk_ref, dv_ref, dk_acc_ref, dv_acc_ref = outs
    bq, bk = q_ref.shape[1], k_ref.shape[0]
    # The logits transposed, [keys, queries], so that dK and dV are plain products.
    dk_acc_ref[...] = jnp.zeros_like(dk_acc_ref)
    dv_acc_ref[...] = jnp.zeros_like(dv_acc_ref)
    k, v, k_ids = k_ref[...], v_ref[...], k_ids_ref[...]

    def accumulate(c):
        q, do = q_ref[c], do_ref[c]
        s_t = lax.dot_general(k, q, _NT, preferred_element_type=jnp.float32) * scale
        visible = _visible(k_ids, q_ids_ref[c, :1, :])
        visible = _windowed(visible, window, c, block, q_axis=1)
        p_t = jnp.where(visible, jnp.exp(s_t - lse_ref[c, :1, :]), 0.0)
        dropped = p_t
        if rate:
            drop = functools.partial(
                _dropped, seed=seed, rate=rate, q_start=c * bq, k_start=block * bk, q_axis=1
            )  # fmt: skip
            dropped = drop(p_t)
        dv_acc_ref[...] += lax.dot_general(
            dropped.astype(do.dtype), do, _NN, preferred_element_type=jnp.float32
        )
        dp_t = lax.dot_general(v, do, _NT, preferred_element_type=jnp.float32)
        if rate:
            dp_t = drop(dp_t)
        ds_t = p_t * (dp_t - di_ref[c, :1, :])
        dk_acc_ref[...] += lax.dot_general(
            ds_t.astype(q.dtype), q, _NN, preferred_element_type=jnp.float32
        )

    _for_each_block(first_ref, stop_ref, accumulate)
    dk_ref[...] = (dk_acc_ref[...] * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_acc_ref[...].astype(dv_ref.dtype)


def _backward_dkv(
    q, k, v, segment_ids, d_out, lse, di, seeds, blocks: Blocks, rate: float, window
) -> tuple[Array, Array]:
    batch, heads, length, head_dim = q.shape
    bq, bk = blocks.q, blocks.k
    first, stop = (r.reshape(-1) for r in q_ranges(segment_ids, bq, bk, window))
    kv_block = pl.BlockSpec((None, None, bk, head_dim), lambda b, h, c, *_: (b, h, c, 0))
    row = pl.BlockSpec(
        (None, None, length // bq, bq, head_dim), lambda b, h, c, *_: (b, h, 0, 0, 0)
    )
    per_query = pl.BlockSpec(
        (None, None, length // bq, SUBLANES, bq), lambda b, h, c, *_: (b, h, 0, 0, 0)
    )
    return _call(
        functools.partial(_dkv_kernel, scale=head_dim**-0.5, rate=rate, window=window),
        "packed_attention_dkv",
        (batch, heads, length // bk),
        [
            row, kv_block, kv_block, row, per_query, per_query,
            pl.BlockSpec((None, bk, LANES), lambda b, h, c, *_: (b, c, 0)),
            pl.BlockSpec((None, length // bq, SUBLANES, bq), lambda b, h, c, *_: (b, 0, 0, 0)),
        ],
        [kv_block, kv_block],
        [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        [pltpu.VMEM((bk, head_dim), jnp.float32), pltpu.VMEM((bk, head_dim), jnp.float32)],
        blocks, seeds,
        first, stop, _blocks(q, bq), k, v, _blocks(d_out, bq), lse, di,
        _along_sublanes(segment_ids),
        _blocks_along_lanes(segment_ids, bq),
    )  # fmt: skip
