"""The Pallas kernels for GPU (Triton); CPU only with interpret=True. TPU: `block_sparse_tpu`.

Three kernels, each looping over the nonzero blocks only:

  forward   grid (row tiles, output block columns): y[t, j] = sum_k x[t, src_jk] @ W[blk_jk]
  input grad grid (row tiles, input block rows):    same kernel on the transposed structure
                                                    with the blocks transposed
  weight grad grid (nnz,):                          dW[n] = sum_t x[t, row_n]^T @ g[t, col_n]

The per-column block lists come from the same padded plans as the XLA path (one chunk holding all
columns), with a per-column count as the loop bound, so padding costs no work here. Accumulation is
in float32.

Status: verified against the XLA path in interpret mode on CPU (tests). On GPU, Triton needs
block sizes of at least 16 for its dot; `block_sparse_matmul` keeps the XLA path for smaller
blocks. Mosaic cannot tile these kernels' whole-row blocks, hence `block_sparse_tpu`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from bert_flax.kernels.block_sparse_plan import GroupedPlan, grouped_plan

if TYPE_CHECKING:  # the layout is the layer's; the kernels read its index arrays
    from bert_flax.block_sparse.layout import BlockSparseLayout

ROW_TILE = 128


def column_lists(plan: GroupedPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src [cols, K], blk [cols, K], count [cols]) in natural column order (one-chunk plan)."""
    (chunk,) = plan.chunks
    order = np.argsort(chunk.cols)
    src, blk = chunk.src[order], chunk.blk[order]
    count = (blk < plan.valid.size).sum(axis=1).astype(np.int32)
    return src, blk, count


def _grouped_kernel(src_ref, blk_ref, count_ref, a_ref, w_ref, o_ref, *, bs):
    j = pl.program_id(1)

    def body(k, acc):
        a = a_ref[:, pl.ds(src_ref[j, k] * bs, bs)]
        w = w_ref[blk_ref[j, k]]
        return acc + jnp.dot(a, w, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, count_ref[j], body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _grouped_product(a2, w_blocks, plan: GroupedPlan, bs: int, out_features: int, interpret):
    """out[:, col] = sum over col's blocks of a2[:, src] @ w_blocks[blk], a2 [rows, k_features]."""
    src, blk, count = (jnp.asarray(v) for v in column_lists(plan))
    rows = a2.shape[0]
    tile = _row_tile(rows)
    a2 = pad_rows(a2, tile)
    full = lambda arr: pl.BlockSpec(arr.shape, lambda t, j, nd=arr.ndim: (0,) * nd)
    out = pl.pallas_call(
        functools.partial(_grouped_kernel, bs=bs),
        name="block_sparse_product",  # the roofline knows it by name (bert_flax.hlo.cost)
        out_shape=jax.ShapeDtypeStruct((a2.shape[0], out_features), a2.dtype),
        grid=(a2.shape[0] // tile, out_features // bs),
        in_specs=[
            full(src),
            full(blk),
            full(count),
            pl.BlockSpec((tile, a2.shape[1]), lambda t, j: (t, 0)),
            full(w_blocks),
        ],
        out_specs=pl.BlockSpec((tile, bs), lambda t, j: (t, j)),
        interpret=interpret,
    )(src, blk, count, a2, w_blocks)
    return out[:rows]


def _weight_grad_kernel(rows_ref, cols_ref, x_ref, g_ref, o_ref, *, bs, tile, n_tiles):
    n = pl.program_id(0)
    i, j = rows_ref[n], cols_ref[n]

    def body(t, acc):
        xs = x_ref[pl.ds(t * tile, tile), pl.ds(i * bs, bs)]
        gs = g_ref[pl.ds(t * tile, tile), pl.ds(j * bs, bs)]
        return acc + lax.dot_general(
            xs, gs, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )

    acc = lax.fori_loop(0, n_tiles, body, jnp.zeros((bs, bs), jnp.float32))
    o_ref[0] = acc.astype(o_ref.dtype)


def _row_tile(rows: int) -> int:
    """A power of two (Triton's block shapes must be), at most ROW_TILE."""
    return min(ROW_TILE, 1 << max(0, (rows - 1).bit_length()))


def pad_rows(a: jax.Array, tile: int) -> jax.Array:
    extra = -a.shape[0] % tile
    return jnp.pad(a, ((0, extra), (0, 0))) if extra else a


def forward(x2, blocks, layout: BlockSparseLayout, *, interpret: bool = False):
    plan = grouped_plan(layout, "out", layout.out_blocks)
    return _grouped_product(x2, blocks, plan, layout.block_size, layout.out_features, interpret)


def backward(x2, blocks, g2, layout: BlockSparseLayout, *, interpret: bool = False):
    bs = layout.block_size
    plan_in = grouped_plan(layout, "in", layout.in_blocks)
    g2 = g2.astype(x2.dtype)
    dx = _grouped_product(
        g2, jnp.swapaxes(blocks, 1, 2), plan_in, bs, layout.in_features, interpret
    )
    tile = _row_tile(x2.shape[0])
    xp, gp = pad_rows(x2, tile), pad_rows(g2, tile)
    rows, cols = jnp.asarray(layout.rows), jnp.asarray(layout.cols)
    full = lambda arr: pl.BlockSpec(arr.shape, lambda n, nd=arr.ndim: (0,) * nd)
    dblocks = pl.pallas_call(
        functools.partial(_weight_grad_kernel, bs=bs, tile=tile, n_tiles=xp.shape[0] // tile),
        name="block_sparse_weight_grad",  # the roofline knows it by name (bert_flax.hlo.cost)
        out_shape=jax.ShapeDtypeStruct(blocks.shape, blocks.dtype),
        grid=(layout.nnz,),
        in_specs=[full(rows), full(cols), full(xp), full(gp)],
        out_specs=pl.BlockSpec((1, bs, bs), lambda n: (n, 0, 0)),
        interpret=interpret,
    )(rows, cols, xp, gp)
    return dx, dblocks
