"""How Shampoo cuts a parameter into blocks and which preconditioner each dimension gets.

For a parameter of shape ``shape``:

1. Size-1 dimensions are dropped and neighbouring small dimensions merged while their product
   stays within ``block_size`` (``[3, 3, 64, 128]`` -> ``[9, 64, 128]`` for 128), but a tensor
   with two or more dimensions above 1 stays at least a matrix (``[4, 4, 4]`` -> ``[16, 4]``).
2. A merged shape of rank <= 1 (biases, scales, scalars) gets an elementwise (AdaGrad-style)
   diagonal preconditioner.
3. Otherwise each merged dimension of size ``d`` gets
   * a *diagonal* factor (a vector) if ``d > max_preconditioner_dim``;
   * full Kronecker factors of ``b x b`` if ``d <= block_size`` (``b = d``), else it is split into
     ``n = ceil(d / block_size)`` equal blocks of ``b = ceil(d / n)`` (zero-padded to ``n * b``).

The blocks of a tensor are stacked on a leading axis: a blocked gradient has shape
``[num_blocks, b_1, ..., b_k]`` and a factor of dimension ``i`` has shape ``[num_blocks, b_i, b_i]``
(full) or ``[num_blocks, b_i]`` (diagonal), so every block is preconditioned in one batched op.

A *stacked* parameter (``[layers, ...]``, the identical layers of a scanned model) is a batch of
layers: steps 1-3 apply to one layer's shape, and the blocks of every layer go on the leading
axis (layer-major), so each layer gets the statistics it would get unstacked.
"""

from __future__ import annotations

import dataclasses
import math
import string

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def merge_small_dims(shape: tuple[int, ...], max_dim: int) -> tuple[int, ...]:
    """Drop size-1 dims and merge neighbours while the product stays <= ``max_dim``.

    A tensor with two or more dims > 1 keeps at least two (a small matrix stays a matrix).
    """
    dims = [d for d in shape if d != 1]
    merged: list[int] = []
    for d in dims:
        if merged and merged[-1] * d <= max_dim:
            merged[-1] *= d
        else:
            merged.append(d)
    if len(merged) == 1 and len(dims) >= 2:
        return (merged[0] // dims[-1], dims[-1])
    return tuple(merged)


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """The static blocking of one parameter (see the module doc)."""

    shape: tuple[int, ...]  # the parameter's shape
    merged: tuple[int, ...]  # after dropping/merging small dims
    num_blocks_per_dim: tuple[int, ...]
    block_dims: tuple[int, ...]  # b_i
    diagonal_dims: tuple[bool, ...]  # True where dimension i gets a diagonal factor
    stacked: bool = False  # shape[0] counts layers, each blocked on its own (module doc)

    @classmethod
    def create(
        cls,
        shape: tuple[int, ...],
        block_size: int,
        max_preconditioner_dim: int,
        stacked: bool = False,
    ) -> BlockPlan:
        shape = tuple(int(d) for d in shape)
        merged = merge_small_dims(shape[1:] if stacked else shape, block_size)
        if len(merged) <= 1:
            return cls(shape, merged, (), (), (), stacked)
        nums, blocks, diag = [], [], []
        for d in merged:
            is_diag = d > max_preconditioner_dim
            n = 1 if is_diag else math.ceil(d / block_size)
            nums.append(n)
            blocks.append(math.ceil(d / n))
            diag.append(is_diag)
        return cls(shape, merged, tuple(nums), tuple(blocks), tuple(diag), stacked)

    @classmethod
    def elementwise_plan(cls, shape: tuple[int, ...], stacked: bool = False) -> BlockPlan:
        """No blocks: the parameter is preconditioned elementwise, as a vector would be."""
        shape = tuple(int(d) for d in shape)
        return cls(shape, (math.prod(shape[1:] if stacked else shape),), (), (), (), stacked)

    @property
    def layers(self) -> int:
        """Layers stacked on the leading axis (1 when not stacked)."""
        return self.shape[0] if self.stacked else 1

    @property
    def elementwise(self) -> bool:
        """Rank <= 1 after merging: an elementwise diagonal preconditioner, no blocks."""
        return not self.block_dims

    @property
    def rank(self) -> int:
        return len(self.block_dims)

    @property
    def num_blocks(self) -> int:
        """Blocks of the whole parameter (of every layer when stacked)."""
        return self.layers * math.prod(self.num_blocks_per_dim)

    @property
    def full_dims(self) -> tuple[int, ...]:
        return tuple(i for i, diag in enumerate(self.diagonal_dims) if not diag)

    @property
    def factor_shapes(self) -> tuple[tuple[int, int, int], ...]:
        """Shapes of the full (Kronecker) factors, one per non-diagonal dimension."""
        return tuple(
            (self.num_blocks, self.block_dims[i], self.block_dims[i]) for i in self.full_dims
        )

    @property
    def diagonal_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shapes of the diagonal factors (the parameter's shape when elementwise)."""
        if self.elementwise:
            return (self.shape,)
        return tuple(
            (self.num_blocks, self.block_dims[i]) for i, d in enumerate(self.diagonal_dims) if d
        )

    def block(self, x: jax.Array) -> jax.Array:
        """``x`` (the parameter's shape) -> ``[num_blocks, b_1, ..., b_k]``, zero-padded."""
        if not self.stacked:
            return self._block_layer(x)
        return jax.vmap(self._block_layer)(x).reshape((self.num_blocks, *self.block_dims))

    def unblock(self, x: jax.Array) -> jax.Array:
        """The inverse of :meth:`block` (padding removed)."""
        if not self.stacked:
            return self._unblock_layer(x)
        return jax.vmap(self._unblock_layer)(x.reshape((self.layers, -1, *self.block_dims)))

    def _block_layer(self, x: jax.Array) -> jax.Array:
        x = x.reshape(self.merged)
        padded = [n * b for n, b in zip(self.num_blocks_per_dim, self.block_dims)]
        x = jnp.pad(x, [(0, p - d) for p, d in zip(padded, self.merged)])
        k = self.rank
        x = x.reshape([s for nb in zip(self.num_blocks_per_dim, self.block_dims) for s in nb])
        x = x.transpose([*range(0, 2 * k, 2), *range(1, 2 * k, 2)])
        return x.reshape((-1, *self.block_dims))

    def _unblock_layer(self, x: jax.Array) -> jax.Array:
        k = self.rank
        x = x.reshape((*self.num_blocks_per_dim, *self.block_dims))
        x = x.transpose([j for i in range(k) for j in (i, k + i)])
        x = x.reshape([n * b for n, b in zip(self.num_blocks_per_dim, self.block_dims)])
        layer_shape = self.shape[1:] if self.stacked else self.shape
        return x[tuple(slice(0, d) for d in self.merged)].reshape(layer_shape)


def _letters(k: int) -> str:
    return string.ascii_lowercase[:k]


def factor_statistic(blocks: jax.Array, dim: int) -> jax.Array:
    """``G_(dim) G_(dim)^T`` per block: ``[N, b_1..b_k] -> [N, b_dim, b_dim]``."""
    axes = _letters(blocks.ndim - 1)
    other = axes[:dim] + "z" + axes[dim + 1 :]
    return jnp.einsum(f"N{axes},N{other}->N{axes[dim]}z", blocks, blocks, precision=_HIGHEST)


def diagonal_statistic(blocks: jax.Array, dim: int) -> jax.Array:
    """Sum of squares over all but ``dim`` per block: ``[N, b_1..b_k] -> [N, b_dim]``."""
    axes = _letters(blocks.ndim - 1)
    return jnp.einsum(f"N{axes},N{axes}->N{axes[dim]}", blocks, blocks, precision=_HIGHEST)


def apply_factor(blocks: jax.Array, root: jax.Array, dim: int) -> jax.Array:
    """Multiply dimension ``dim`` of every block by its (symmetric) root ``[N, b, b]``."""
    axes = _letters(blocks.ndim - 1)
    out = axes[:dim] + "z" + axes[dim + 1 :]
    return jnp.einsum(f"Nz{axes[dim]},N{axes}->N{out}", root, blocks, precision=_HIGHEST)


def apply_diagonal(blocks: jax.Array, scale: jax.Array, dim: int) -> jax.Array:
    """Multiply dimension ``dim`` of every block by a per-index ``scale`` ``[N, b]``."""
    shape = [scale.shape[0]] + [1] * (blocks.ndim - 1)
    shape[dim + 1] = scale.shape[1]
    return blocks * scale.reshape(shape)
