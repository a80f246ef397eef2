"""The XLA implementation: each product is a few matmuls over gathered blocks.

Activations stay in their natural [rows, features] layout, viewed as [rows, blocks, block_size].
Per chunk of grouped columns (see `block_sparse_plan.py`) the needed block columns are gathered
into one contiguous [chunk, rows, K * block_size] operand (each slice copies `block_size`
contiguous values of every row) and multiplied in one `dot_general` with a batch dimension:

  forward     y[:, j]  = sum_k x[:, src_jk] @ W[src_jk, j]        (grouped by output column)
  input grad  dx[:, i] = sum_k g[:, src_ik] @ W[i, src_ik]^T      (grouped by input row)
  weight grad dW[n]    = x[:, row_n]^T @ g[:, col_n]              (same gather of g as dx)

Work and memory scale with the nonzero blocks (plus per-chunk padding); no scatter-add: results
are reassembled with static gathers. Small chunks keep each gathered operand in cache, which is
what makes this fast on CPU; see docs/block_sparse.md, and docs/results.md ("Block-sparse") for
the measurements behind the choices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jax import lax

from bert_flax.kernels.block_sparse_plan import GroupedPlan, default_chunk, grouped_plan

if TYPE_CHECKING:  # the layout is the layer's; the kernels read its index arrays
    from bert_flax.block_sparse.layout import BlockSparseLayout

# One chunk's gathered operand is about this big (small: it stays in cache on CPU), and a pass
# has at most MAX_CHUNKS chunks (bounds program size and compile time for small blocks).
CHUNK_BYTES = 1 << 18
MAX_CHUNKS = 128


def _gather_columns(a3: jax.Array, src) -> jax.Array:
    """a3 [rows, blocks, bs], src [C, K] -> [C, rows, K * bs] (block columns side by side)."""
    c, k = src.shape
    g = jnp.take(a3, src.reshape(-1), axis=1, mode="clip")  # [rows, C * K, bs]
    return g.reshape(a3.shape[0], c, k * a3.shape[2]).transpose(1, 0, 2)


def _bmm(a: jax.Array, b: jax.Array, contract: tuple[int, int], out_dtype) -> jax.Array:
    dims = (((contract[0],), (contract[1],)), ((0,), (0,)))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32).astype(out_dtype)


def _concat(parts: list[jax.Array]) -> jax.Array:
    return jnp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]


def grouped_product(a2: jax.Array, w_blocks: jax.Array, plan: GroupedPlan, out_dtype):
    """out[:, col] = sum over col's blocks of a2[:, src] @ w_blocks[blk] -> [rows, cols * bs].

    `w_blocks` [nnz, bs_contract, bs_out] are the stored blocks oriented for this product.
    """
    rows, bs = a2.shape[0], w_blocks.shape[1]
    a3 = a2.reshape(rows, -1, bs)
    outs = []
    for ch in plan.chunks:
        c, k = ch.src.shape
        w = jnp.take(w_blocks, ch.blk, axis=0, mode="fill", fill_value=0)  # [C, K, bc, bo]
        w = w.reshape(c, k * bs, w_blocks.shape[2])
        outs.append(_bmm(_gather_columns(a3, ch.src), w, (2, 1), out_dtype))  # [C, rows, bo]
    if plan.natural_order:  # one column per chunk: place them side by side
        return jnp.concatenate([o[0] for o in outs], axis=1)
    out = jnp.take(_concat(outs), plan.inverse, axis=0, mode="clip")  # [cols, rows, bo]
    return out.transpose(1, 0, 2).reshape(rows, -1)


def input_and_weight_grad(
    x2: jax.Array, blocks: jax.Array, g2: jax.Array, plan_in: GroupedPlan, out_dtypes
) -> tuple[jax.Array, jax.Array]:
    """dx = g @ W^T and dW[n] = x[:, row_n]^T @ g[:, col_n], sharing one gather of g.

    Grouped by input row: per chunk, the gathered g [C, rows, K*bs] meets the transposed
    blocks (dx) and the chunk's own x columns [C, rows, bs] (dW of the row's blocks).
    """
    rows, bs = x2.shape[0], blocks.shape[1]
    x3, g3 = x2.reshape(rows, -1, bs), g2.reshape(rows, -1, bs)
    blocks_t = jnp.swapaxes(blocks, 1, 2)
    dx_parts, dw_parts = [], []
    for ch in plan_in.chunks:
        c, k = ch.src.shape
        g = _gather_columns(g3, ch.src)  # [C, rows, K * bo]
        w = jnp.take(blocks_t, ch.blk, axis=0, mode="fill", fill_value=0).reshape(c, k * bs, bs)
        dx_parts.append(_bmm(g, w, (2, 1), out_dtypes[0]))  # [C, rows, bi]
        x = jnp.take(x3, ch.cols, axis=1, mode="clip").transpose(1, 0, 2)  # [C, rows, bi]
        d = _bmm(x, g, (1, 1), out_dtypes[1])  # [C, bi, K * bo]
        dw_parts.append(d.reshape(c, bs, k, bs).transpose(0, 2, 1, 3).reshape(c * k, bs, bs))
    dblocks = jnp.take(_concat(dw_parts), plan_in.valid, axis=0, mode="clip")
    if plan_in.natural_order:
        return jnp.concatenate([o[0] for o in dx_parts], axis=1), dblocks
    dx = jnp.take(_concat(dx_parts), plan_in.inverse, axis=0, mode="clip")
    return dx.transpose(1, 0, 2).reshape(rows, -1), dblocks


def plans(layout: BlockSparseLayout, rows: int, itemsize: int) -> tuple[GroupedPlan, GroupedPlan]:
    """(by-output-column plan, by-input-row plan) with chunks sized for `rows` activations."""

    def plan(by: str) -> GroupedPlan:
        chunk = default_chunk(layout, by, rows, itemsize, CHUNK_BYTES, MAX_CHUNKS)
        return grouped_plan(layout, by, chunk)

    return plan("out"), plan("in")


def forward(x2: jax.Array, blocks: jax.Array, layout: BlockSparseLayout, out_dtype):
    """y = x2 @ W for x2 [rows, in_features]."""
    plan_out, _ = plans(layout, x2.shape[0], x2.dtype.itemsize)
    return grouped_product(x2, blocks, plan_out, out_dtype)


def backward(x2: jax.Array, blocks: jax.Array, g2: jax.Array, layout: BlockSparseLayout):
    """(dx2 [rows, in], dblocks [nnz, bs, bs]) for the upstream gradient g2 [rows, out]."""
    _, plan_in = plans(layout, g2.shape[0], g2.dtype.itemsize)
    return input_and_weight_grad(x2, blocks, g2, plan_in, (x2.dtype, blocks.dtype))
