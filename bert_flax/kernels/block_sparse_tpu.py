"""The block-sparse kernels for TPU (Pallas through Mosaic); on CPU only with interpret=True.

Mosaic tiles a block's last two dimensions by (8, 128), so the kernels take blocks of 128 (the
MXU's tile): `block_sparse_matmul` keeps the XLA path for smaller blocks on TPU. The nonzero
structure travels as scalar-prefetched index tables, and every grid step moves one block:

  product      grid (row tiles, output block columns, K): y[t, j] += x[t, src[j, k]] @ W[blk[j, k]]
               (K: the most blocks in a column; steps past a column's count repeat its last
               block's indices, so nothing is fetched and nothing added)
  weight grad  grid (nnz, row tiles): dW[n] += x[t, rows[n]]^T @ g[t, cols[n]]

The input gradient is the product on the transposed structure with the blocks transposed.
Accumulation is in float32 VMEM scratch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bert_flax.kernels.block_sparse_gpu import column_lists, pad_rows
from bert_flax.kernels.block_sparse_plan import GroupedPlan, grouped_plan

if TYPE_CHECKING:  # the layout is the layer's; the kernels read its index arrays
    from bert_flax.block_sparse.layout import BlockSparseLayout

BLOCK = 128  # the only block size Mosaic tiles here (blocks' last two dims by (8, 128))
ROW_TILE = 256


def _row_tile(rows: int) -> int:
    """Rows a grid step takes: a multiple of 8 (sublanes), at most ROW_TILE."""
    return min(ROW_TILE, -(-rows // 8) * 8)


def _product_kernel(src_ref, blk_ref, count_ref, a_ref, w_ref, o_ref, acc_ref):
    j, k = pl.program_id(1), pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(k < count_ref[j])
    def _():
        acc_ref[...] += jnp.dot(a_ref[...], w_ref[0], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _grouped_product(a2, w_blocks, plan: GroupedPlan, out_features: int, interpret: bool):
    """out[:, col] = sum over col's blocks of a2[:, src] @ w_blocks[blk], a2 [rows, features]."""
    src, blk, count = column_lists(plan)
    blk = np.minimum(blk, w_blocks.shape[0] - 1)  # padding slots: a real block, never added
    tile = _row_tile(a2.shape[0])
    padded = pad_rows(a2, tile)

    def last(j, k, count):  # steps past a column's blocks keep its last block (no new fetch)
        return j, jnp.maximum(jnp.minimum(k, count[j] - 1), 0)

    def a_index(t, j, k, src, blk, count):
        return t, src[last(j, k, count)]

    def w_index(t, j, k, src, blk, count):
        return blk[last(j, k, count)], 0, 0

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(padded.shape[0] // tile, out_features // BLOCK, src.shape[1]),
        in_specs=[
            pl.BlockSpec((tile, BLOCK), a_index),
            pl.BlockSpec((1, BLOCK, BLOCK), w_index),
        ],
        out_specs=pl.BlockSpec((tile, BLOCK), lambda t, j, k, *_: (t, j)),
        scratch_shapes=[pltpu.VMEM((tile, BLOCK), jnp.float32)],
    )
    out = pl.pallas_call(
        _product_kernel,
        name="block_sparse_product",  # the roofline knows it by name (bert_flax.hlo.cost)
        out_shape=jax.ShapeDtypeStruct((padded.shape[0], out_features), a2.dtype),
        grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
    )(jnp.asarray(src), jnp.asarray(blk), jnp.asarray(count), padded, w_blocks)
    return out[: a2.shape[0]]


def _weight_grad_kernel(rows_ref, cols_ref, x_ref, g_ref, o_ref, acc_ref):
    t = pl.program_id(1)

    @pl.when(t == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jax.lax.dot_general(
        x_ref[...], g_ref[...], (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )

    @pl.when(t == pl.num_programs(1) - 1)
    def _():
        o_ref[0] = acc_ref[...].astype(o_ref.dtype)


def _check_block(layout: BlockSparseLayout) -> None:
    if layout.block_size != BLOCK:
        raise ValueError(
            f"The TPU block-sparse kernels take blocks of {BLOCK}, not {layout.block_size}; "
            "use block_size=128 or impl='xla'."
        )


def forward(x2, blocks, layout: BlockSparseLayout, *, interpret: bool = False):
    _check_block(layout)
    plan = grouped_plan(layout, "out", layout.out_blocks)
    return _grouped_product(x2, blocks, plan, layout.out_features, interpret)


def backward(x2, blocks, g2, layout: BlockSparseLayout, *, interpret: bool = False):
    _check_block(layout)
    g2 = g2.astype(x2.dtype)
    plan_in = grouped_plan(layout, "in", layout.in_blocks)
    dx = _grouped_product(g2, jnp.swapaxes(blocks, 1, 2), plan_in, layout.in_features, interpret)
    tile = _row_tile(x2.shape[0])
    xp, gp = pad_rows(x2, tile), pad_rows(g2, tile)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(layout.nnz, xp.shape[0] // tile),
        in_specs=[
            pl.BlockSpec((tile, BLOCK), lambda n, t, rows, cols: (t, rows[n])),
            pl.BlockSpec((tile, BLOCK), lambda n, t, rows, cols: (t, cols[n])),
        ],
        out_specs=pl.BlockSpec((1, BLOCK, BLOCK), lambda n, t, *_: (n, 0, 0)),
        scratch_shapes=[pltpu.VMEM((BLOCK, BLOCK), jnp.float32)],
    )
    dblocks = pl.pallas_call(
        _weight_grad_kernel,
        name="block_sparse_weight_grad",  # the roofline knows it by name (bert_flax.hlo.cost)
        out_shape=jax.ShapeDtypeStruct(blocks.shape, blocks.dtype),
        grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(jnp.asarray(layout.rows, jnp.int32), jnp.asarray(layout.cols, jnp.int32), xp, gp)
    return dx, dblocks
