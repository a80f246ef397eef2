"""`BlockSparseDense`: a Dense layer whose kernel is stored as its nonzero blocks only."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_flax.block_sparse.layout import BlockSparseLayout, make_layout
from bert_flax.block_sparse.matmul import block_sparse_matmul

Initializer = Callable[..., jax.Array]
BLOCKS_AXES = ("sparse_blocks", "sparse_block_in", "sparse_block_out")


def layer_seed(seed: int, path: str) -> int:
    """A per-layer layout seed, stable across runs and processes (crc32 of the layer path)."""
    return (seed + zlib.crc32(path.encode())) % (1 << 31)


class BlockSparseDense(nn.Module):
    """y = x @ W + b with W [in, features] block-sparse.

    Either pass `layout` (its out_features must equal `features`), or let the layer draw one at
    first call from `layout_kind`, `density`, `block_size` and `seed` (mixed with the module path,
    so every layer gets its own layout, identically at init and apply).

    Attributes:
      features: output width.
      layout: a fixed block structure, or None to generate one.
      block_size, density, layout_kind, seed: the generated layout (`make_layout`).
      use_bias: add a bias.
      kernel_init: base sampler for the blocks [nnz, bs, bs] (unit scale); block column j is
        multiplied by `1 / sqrt(fan_in_j)` with fan_in_j its real fan-in (LeCun scaling), so
        outputs have the same variance whatever the density.
      dense_stddev: if set, scale instead like a dense layer initialised with this stddev, on
        the real fan-in: `dense_stddev * sqrt(in_features / fan_in_j)` (BERT's 0.02 init).
      kernel_axes: logical names of the dense (input, output) axes; the bias takes the output one
        and the blocks get BLOCKS_AXES (replicated unless the rule table maps them).
      impl: matmul implementation (see `block_sparse_matmul`).
    """

    features: int
    layout: BlockSparseLayout | None = None
    block_size: int = 32
    density: float = 0.1
    layout_kind: str = "random"
    seed: int = 0
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Initializer = nn.initializers.truncated_normal(1.0)
    dense_stddev: float | None = None
    bias_init: Initializer = nn.initializers.zeros
    kernel_axes: tuple[str | None, str | None] = (None, None)
    impl: str | None = None

    def get_layout(self, in_features: int) -> BlockSparseLayout:
        if self.layout is not None:
            layout = self.layout
        else:
            path = "/".join(str(p) for p in self.scope.path)
            layout = make_layout(
                self.layout_kind,
                in_features,
                self.features,
                self.block_size,
                self.density,
                seed=layer_seed(self.seed, path),
            )
        if (layout.in_features, layout.out_features) != (in_features, self.features):
            raise ValueError(
                f"{self.name}: layout is {layout.in_features}x{layout.out_features}, but the "
                f"layer maps {in_features} -> {self.features} features."
            )
        return layout

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        layout = self.get_layout(x.shape[-1])
        scale = 1.0 if self.dense_stddev is None else self.dense_stddev * np.sqrt(x.shape[-1])
        col_scale = scale / np.sqrt(layout.fan_in()[layout.cols])

        def init_blocks(key, shape, dtype=jnp.float32):
            base = self.kernel_init(key, shape, dtype)
            return base * jnp.asarray(col_scale, dtype)[:, None, None]

        blocks = self.param(
            "blocks",
            nn.with_logical_partitioning(init_blocks, BLOCKS_AXES),
            layout.blocks_shape,
            self.param_dtype,
        )
        dtype = self.dtype or jnp.result_type(x, blocks)
        y = block_sparse_matmul(x.astype(dtype), jnp.asarray(blocks, dtype), layout, impl=self.impl)
        if self.use_bias:
            bias = self.param(
                "bias",
                nn.with_logical_partitioning(self.bias_init, (self.kernel_axes[1],)),
                (self.features,),
                self.param_dtype,
            )
            y = y + jnp.asarray(bias, dtype)
        return y
