"""The XLA implementation: each product is a few batched matmuls over gathered blocks.

Everything runs in "transposed space": activations are kept as [blocks, block_size, rows], so a
gather of block rows copies contiguous [block_size, rows] slabs and feeds `dot_general` without
a relayout. Per chunk of grouped columns (see `plan.py`):

  forward   y^T[j]  = sum_k W[src_jk, j]^T x^T[src_jk]      (grouped by output column)
  input grad dx^T[i] = sum_k W[i, src_ik]   g^T[src_ik]      (grouped by input row)
  weight grad dW[n]  = x^T[row_n] g^T[col_n]^T              (per nonzero, grouped by column)

so work and memory scale with the nonzero blocks (plus per-chunk padding), and no scatter-add is
needed: outputs are reassembled with static gathers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from bert_flax.block_sparse.layout import BlockSparseLayout
from bert_flax.block_sparse.plan import GroupedPlan, default_chunk, grouped_plan

# One chunk's gathered operand is about this big: small enough to stay in cache on CPU.
CHUNK_BYTES = 1 << 21


def to_blocks_t(a: jax.Array, block_size: int) -> jax.Array:
    """[rows, features] -> [features // block_size, block_size, rows]."""
    return a.T.reshape(a.shape[1] // block_size, block_size, a.shape[0])


def from_blocks_t(a_t: jax.Array) -> jax.Array:
    """[blocks, block_size, rows] -> [rows, blocks * block_size]."""
    return a_t.reshape(-1, a_t.shape[-1]).T


def _gather_src(src_t: jax.Array, src) -> jax.Array:
    c, k = src.shape
    g = jnp.take(src_t, src.reshape(-1), axis=0, mode="clip")
    return g.reshape(c, k * src_t.shape[1], src_t.shape[2])


def _bmm(a: jax.Array, b: jax.Array, contract: tuple[int, int], out_dtype) -> jax.Array:
    dims = (((contract[0],), (contract[1],)), ((0,), (0,)))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32).astype(out_dtype)


def grouped_product_t(src_t: jax.Array, lhs_blocks: jax.Array, plan: GroupedPlan, out_dtype):
    """out^T[col] = sum over the col's blocks of lhs_blocks[blk] @ src_t[src]: [cols, bs, rows].

    `lhs_blocks` [nnz, bs_out, bs_contract] are the stored blocks oriented for this product.
    """
    outs = []
    for ch in plan.chunks:
        c, k = ch.src.shape
        w = jnp.take(lhs_blocks, ch.blk, axis=0, mode="fill", fill_value=0)  # [C, K, bo, bc]
        w = w.transpose(0, 2, 1, 3).reshape(c, lhs_blocks.shape[1], k * lhs_blocks.shape[2])
        outs.append(_bmm(w, _gather_src(src_t, ch.src), (2, 1), out_dtype))  # [C, bo, rows]
    out = jnp.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]
    return jnp.take(out, plan.inverse, axis=0, mode="clip")


def weight_grad_t(x_t: jax.Array, g_t: jax.Array, plan: GroupedPlan, out_dtype) -> jax.Array:
    """dW[n] = x^T[row_n] @ g^T[col_n]^T for every nonzero n: [nnz, bs_in, bs_out]."""
    parts = []
    bs = x_t.shape[1]
    for ch in plan.chunks:
        c, k = ch.src.shape
        g = jnp.take(g_t, ch.cols, axis=0, mode="clip")  # [C, bo, rows]
        d = _bmm(_gather_src(x_t, ch.src), g, (2, 2), out_dtype)  # [C, K * bi, bo]
        parts.append(d.reshape(c * k, bs, g_t.shape[1]))
    padded = jnp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    return jnp.take(padded, plan.valid, axis=0, mode="clip")


def plans(layout: BlockSparseLayout, rows: int, itemsize: int) -> tuple[GroupedPlan, GroupedPlan]:
    """(by-output-column plan, by-input-row plan) with chunks sized for `rows` activations."""
    out = grouped_plan(layout, "out", default_chunk(layout, "out", rows, itemsize, CHUNK_BYTES))
    inp = grouped_plan(layout, "in", default_chunk(layout, "in", rows, itemsize, CHUNK_BYTES))
    return out, inp


def forward(x2: jax.Array, blocks: jax.Array, layout: BlockSparseLayout, out_dtype):
    """y = x2 @ W for x2 [rows, in]; returns (y, x_t) with x_t kept for the backward pass."""
    plan_out, _ = plans(layout, x2.shape[0], x2.dtype.itemsize)
    x_t = to_blocks_t(x2, layout.block_size)
    y_t = grouped_product_t(x_t, jnp.swapaxes(blocks, 1, 2), plan_out, out_dtype)
    return from_blocks_t(y_t), x_t


def backward(x_t: jax.Array, blocks: jax.Array, g2: jax.Array, layout: BlockSparseLayout, x_dtype):
    """(dx2 [rows, in], dblocks [nnz, bs, bs]) for upstream gradient g2 [rows, out]."""
    plan_out, plan_in = plans(layout, g2.shape[0], g2.dtype.itemsize)
    g_t = to_blocks_t(g2, layout.block_size)
    dx = from_blocks_t(grouped_product_t(g_t, blocks, plan_in, x_dtype))
    dblocks = weight_grad_t(x_t, g_t, plan_out, blocks.dtype)
    return dx, dblocks
