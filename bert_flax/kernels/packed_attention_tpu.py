"""Flash attention for packed rows on TPU (Pallas, Mosaic) that visits only the blocks where
queries and keys of one sequence meet.

Each query block reads the range of key/value blocks its sequences span (`kv_ranges`, computed
once a row and prefetched into SMEM as scalars); the grid still walks every kv block, but a step
past the range re-reads the range's last block (the same block index, so no copy is issued) and
computes nothing. The backward pass does the same twice: dQ over each query block's kv range,
dK and dV over each kv block's query range (`q_ranges`). Within a visited block the segment mask
applies: query i sees key j iff both hold the same non-zero segment id; padding (id 0) sees
nothing and its outputs (and the gradients through them) are zero, as `xla_attention`'s.

    out = packed_attention(q, k, v, segment_ids)  # [batch, length, heads, head_dim] each

Logits, softmax and accumulators are float32; products take the inputs' dtype. No dropout, no
logit bias. `interpret=True` runs it on any backend (slow: tests).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bert_flax.kernels.block_ranges import check_block_sizes, kv_ranges, q_ranges

Array = jax.Array

LANES = 128
SUBLANES = 8
# Finite, so a row whose keys are all masked never computes inf - inf.
_MASK_VALUE = -1e10
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b


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
    interpret: bool = False,
) -> Array:
    """Attention within each packed sequence, skipping the blocks no sequence spans.

    q, k, v: [batch, length, heads, head_dim]; segment_ids: int32 [batch, length], each
    sequence one contiguous run of its id, 0 padding. Returns [batch, length, heads, head_dim]
    in v's dtype, zero at padding. `length` must be a multiple of both block sizes, which must
    be multiples of 128.
    """
    check_tpu_blocks(q.shape[1], block_q, block_k)
    heads_major = lambda x: x.transpose(0, 2, 1, 3)  # the kernels' [batch, heads, length, dim]
    blocks = Blocks(block_q, block_k, interpret)
    out = _attention(heads_major(q), heads_major(k), heads_major(v), segment_ids, blocks)
    return heads_major(out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q: Array, k: Array, v: Array, segment_ids: Array, blocks: Blocks) -> Array:
    return _forward(q, k, v, segment_ids, blocks)[0]


def _attention_fwd(q, k, v, segment_ids, blocks):
    out, lse = _forward(q, k, v, segment_ids, blocks)
    return out, (q, k, v, segment_ids, out, lse)


def _attention_bwd(blocks, residuals, d_out):
    q, k, v, segment_ids, out, lse = residuals
    # D_i = sum_j P_ij dP_ij = dO_i . O_i: one product per query, before the kernels.
    di = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)
    dq = _backward_dq(q, k, v, segment_ids, d_out, lse, di, blocks)
    dk, dv = _backward_dkv(q, k, v, segment_ids, d_out, lse, di, blocks)
    return dq, dk, dv, None


_attention.defvjp(_attention_fwd, _attention_bwd)


# Per-token values reach a kernel in two layouts, so that neither needs a transpose: along
# sublanes (one token a row, repeated over 128 lanes) for the block whose tokens are the rows of
# the logits, along lanes (one token a column, repeated over 8 sublanes) for the other.
def _along_sublanes(x: Array) -> Array:  # [..., length] -> [..., length, 128]
    return jnp.broadcast_to(x[..., None], (*x.shape, LANES))


def _along_lanes(x: Array) -> Array:  # [..., length] -> [..., 8, length]
    return jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], SUBLANES, x.shape[-1]))


def _widen(x: Array, width: int) -> Array:
    """[rows, 128] lane-repeated values as [rows, width]."""
    return jnp.tile(x, (1, pl.cdiv(width, LANES)))[:, :width]


def _visible(row_ids: Array, col_ids: Array) -> Array:
    """[rows, cols] mask from row ids [rows, 128] (lane-repeated) and column ids [1, cols]:
    the same sequence, not padding."""
    row_ids = _widen(row_ids, col_ids.shape[1])
    return (row_ids == col_ids) & (row_ids != 0)


def _step_block(first_ref, stop_ref, row, step):
    """The block that grid step `step` of range `row` reads: the range's blocks in order, then
    its last one again (a step past the range computes nothing and fetches nothing new)."""
    return jnp.minimum(first_ref[row] + step, jnp.maximum(stop_ref[row] - 1, 0))


def _in_range(first_ref, stop_ref, row, step):
    return first_ref[row] + step < stop_ref[row]


def _call(kernel, name, grid, in_specs, out_specs, out_shape, scratch, blocks, *args):
    """`kernel` over `grid` with two prefetched scalar arrays (the ranges) before `args`."""
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=scratch,
        ),
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        name=name,
        interpret=blocks.interpret,
    )(*args)


def _forward_kernel(
    first_ref, stop_ref, q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref,
    o_ref, lse_ref, m_ref, l_ref, acc_ref, *, scale: float, num_q_blocks: int,
):  # fmt: skip
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    row = b * num_q_blocks + i

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, _MASK_VALUE)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(_in_range(first_ref, stop_ref, row, j))
    def _accumulate():
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * scale
        visible = _visible(q_ids_ref[...], k_ids_ref[:1, :])
        s = jnp.where(visible, s, _MASK_VALUE)
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        # Masked entries are zeroed, not only made small: a query whose keys in this block are
        # all masked (padding, or another sequence) adds nothing.
        p = jnp.where(visible, jnp.exp(s - _widen(m_next, s.shape[1])), 0.0)
        alpha = jnp.exp(m_prev - m_next)
        m_ref[...] = m_next
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
        pv = lax.dot_general(p.astype(v.dtype), v, _NN, preferred_element_type=jnp.float32)
        acc_ref[...] = acc_ref[...] * _widen(alpha, acc_ref.shape[1]) + pv

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        total = l_ref[...]
        seen = total > 0  # False for padding queries: output 0
        l_safe = jnp.where(seen, total, 1.0)
        o_ref[...] = (acc_ref[...] / _widen(l_safe, acc_ref.shape[1])).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(seen, m_ref[...] + jnp.log(l_safe), 0.0)


def _forward(q, k, v, segment_ids, blocks: Blocks) -> tuple[Array, Array]:
    """The output [batch, heads, length, head_dim] and the logsumexp [batch, heads, length]."""
    batch, heads, length, head_dim = q.shape
    bq, bk = blocks.q, blocks.k
    num_q_blocks = length // bq
    first, stop = (r.reshape(-1) for r in kv_ranges(segment_ids, bq, bk))

    def q_map(b, h, i, j, first_ref, stop_ref):
        return b, h, i, 0

    def kv_map(b, h, i, j, first_ref, stop_ref):
        return b, h, _step_block(first_ref, stop_ref, b * num_q_blocks + i, j), 0

    def k_ids_map(b, h, i, j, first_ref, stop_ref):
        return b, 0, kv_map(b, h, i, j, first_ref, stop_ref)[2]

    kernel = functools.partial(_forward_kernel, scale=head_dim**-0.5, num_q_blocks=num_q_blocks)
    out, lse = _call(
        kernel,
        "packed_attention_fwd",
        (batch, heads, num_q_blocks, length // bk),
        [
            pl.BlockSpec((None, None, bq, head_dim), q_map),
            pl.BlockSpec((None, None, bk, head_dim), kv_map),
            pl.BlockSpec((None, None, bk, head_dim), kv_map),
            pl.BlockSpec((None, bq, LANES), lambda b, h, i, j, *_: (b, i, 0)),
            pl.BlockSpec((None, SUBLANES, bk), k_ids_map),
        ],
        [
            pl.BlockSpec((None, None, bq, head_dim), q_map),
            pl.BlockSpec((None, None, bq, LANES), q_map),
        ],
        [
            jax.ShapeDtypeStruct(q.shape, v.dtype),
            jax.ShapeDtypeStruct((batch, heads, length, LANES), jnp.float32),
        ],
        [
            pltpu.VMEM((bq, LANES), jnp.float32),
            pltpu.VMEM((bq, LANES), jnp.float32),
            pltpu.VMEM((bq, head_dim), jnp.float32),
        ],
        blocks,
        first, stop, q, k, v, _along_sublanes(segment_ids), _along_lanes(segment_ids),
    )  # fmt: skip
    return out, lse[..., 0]


def _dq_kernel(
    first_ref, stop_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, q_ids_ref, k_ids_ref,
    dq_ref, acc_ref, *, scale: float, num_q_blocks: int,
):  # fmt: skip
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(_in_range(first_ref, stop_ref, b * num_q_blocks + i, j))
    def _accumulate():
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        width = k.shape[0]
        s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * scale
        visible = _visible(q_ids_ref[...], k_ids_ref[:1, :])
        p = jnp.where(visible, jnp.exp(s - _widen(lse_ref[...], width)), 0.0)
        dp = lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
        ds = p * (dp - _widen(di_ref[...], width))
        acc_ref[...] += lax.dot_general(
            ds.astype(k.dtype), k, _NN, preferred_element_type=jnp.float32
        )

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_ref[...] * scale).astype(dq_ref.dtype)


def _backward_dq(q, k, v, segment_ids, d_out, lse, di, blocks: Blocks) -> Array:
    batch, heads, length, head_dim = q.shape
    bq, bk = blocks.q, blocks.k
    num_q_blocks = length // bq
    first, stop = (r.reshape(-1) for r in kv_ranges(segment_ids, bq, bk))

    def q_map(b, h, i, j, first_ref, stop_ref):
        return b, h, i, 0

    def kv_map(b, h, i, j, first_ref, stop_ref):
        return b, h, _step_block(first_ref, stop_ref, b * num_q_blocks + i, j), 0

    def k_ids_map(b, h, i, j, first_ref, stop_ref):
        return b, 0, kv_map(b, h, i, j, first_ref, stop_ref)[2]

    q_block = pl.BlockSpec((None, None, bq, head_dim), q_map)
    kv_block = pl.BlockSpec((None, None, bk, head_dim), kv_map)
    per_query = pl.BlockSpec((None, None, bq, LANES), q_map)
    kernel = functools.partial(_dq_kernel, scale=head_dim**-0.5, num_q_blocks=num_q_blocks)
    return _call(
        kernel,
        "packed_attention_dq",
        (batch, heads, num_q_blocks, length // bk),
        [
            q_block, kv_block, kv_block, q_block, per_query, per_query,
            pl.BlockSpec((None, bq, LANES), lambda b, h, i, j, *_: (b, i, 0)),
            pl.BlockSpec((None, SUBLANES, bk), k_ids_map),
        ],
        q_block,
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        [pltpu.VMEM((bq, head_dim), jnp.float32)],
        blocks,
        first, stop, q, k, v, d_out, _along_sublanes(lse), _along_sublanes(di),
        _along_sublanes(segment_ids), _along_lanes(segment_ids),
    )  # fmt: skip


def _dkv_kernel(
    first_ref, stop_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, k_ids_ref, q_ids_ref,
    dk_ref, dv_ref, dk_acc_ref, dv_acc_ref, *, scale: float, num_kv_blocks: int,
):  # fmt: skip
    # The logits transposed, [keys, queries], so that dK and dV are plain products.
    b, c, i = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(i == 0)
    def _init():
        dk_acc_ref[...] = jnp.zeros_like(dk_acc_ref)
        dv_acc_ref[...] = jnp.zeros_like(dv_acc_ref)

    @pl.when(_in_range(first_ref, stop_ref, b * num_kv_blocks + c, i))
    def _accumulate():
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        s_t = lax.dot_general(k, q, _NT, preferred_element_type=jnp.float32) * scale
        visible = _visible(k_ids_ref[...], q_ids_ref[:1, :])
        p_t = jnp.where(visible, jnp.exp(s_t - lse_ref[:1, :]), 0.0)
        dv_acc_ref[...] += lax.dot_general(
            p_t.astype(do.dtype), do, _NN, preferred_element_type=jnp.float32
        )
        dp_t = lax.dot_general(v, do, _NT, preferred_element_type=jnp.float32)
        ds_t = p_t * (dp_t - di_ref[:1, :])
        dk_acc_ref[...] += lax.dot_general(
            ds_t.astype(q.dtype), q, _NN, preferred_element_type=jnp.float32
        )

    @pl.when(i == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_acc_ref[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc_ref[...].astype(dv_ref.dtype)


def _backward_dkv(q, k, v, segment_ids, d_out, lse, di, blocks: Blocks) -> tuple[Array, Array]:
    batch, heads, length, head_dim = q.shape
    bq, bk = blocks.q, blocks.k
    num_kv_blocks = length // bk
    first, stop = (r.reshape(-1) for r in q_ranges(segment_ids, bq, bk))

    def kv_map(b, h, c, i, first_ref, stop_ref):
        return b, h, c, 0

    def q_map(b, h, c, i, first_ref, stop_ref):
        return b, h, _step_block(first_ref, stop_ref, b * num_kv_blocks + c, i), 0

    def per_query_map(b, h, c, i, first_ref, stop_ref):
        return b, h, 0, q_map(b, h, c, i, first_ref, stop_ref)[2]

    def q_ids_map(b, h, c, i, first_ref, stop_ref):
        return b, 0, q_map(b, h, c, i, first_ref, stop_ref)[2]

    q_block = pl.BlockSpec((None, None, bq, head_dim), q_map)
    kv_block = pl.BlockSpec((None, None, bk, head_dim), kv_map)
    per_query = pl.BlockSpec((None, None, SUBLANES, bq), per_query_map)
    kernel = functools.partial(_dkv_kernel, scale=head_dim**-0.5, num_kv_blocks=num_kv_blocks)
    return _call(
        kernel,
        "packed_attention_dkv",
        (batch, heads, num_kv_blocks, length // bq),
        [
            q_block, kv_block, kv_block, q_block, per_query, per_query,
            pl.BlockSpec((None, bk, LANES), lambda b, h, c, i, *_: (b, c, 0)),
            pl.BlockSpec((None, SUBLANES, bq), q_ids_map),
        ],
        [kv_block, kv_block],
        [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        [pltpu.VMEM((bk, head_dim), jnp.float32), pltpu.VMEM((bk, head_dim), jnp.float32)],
        blocks,
        first, stop, q, k, v, d_out, _along_lanes(lse), _along_lanes(di),
        _along_sublanes(segment_ids), _along_lanes(segment_ids),
    )  # fmt: skip
