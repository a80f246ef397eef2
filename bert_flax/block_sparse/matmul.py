"""`block_sparse_matmul`: x @ W for a weight stored as its nonzero blocks, with a custom VJP.

Forward, input gradient and weight gradient all cost O(nnz * block_size^2 * rows); zero blocks are
never stored, never multiplied and get no gradient. Three implementations sit behind the function:
"cpu" (a C++ kernel through XLA's FFI, built on first use: the default on CPU for float32 where it
builds), "xla" (batched matmuls over gathered blocks, any backend and dtype; the fallback, logged
with its reason) and "pallas" (Pallas kernels: `kernels/block_sparse_gpu.py` through Triton on
GPU, `kernels/block_sparse_tpu.py` through Mosaic on TPU for blocks of 128; the default there; on
CPU they run only in interpret mode, for tests).
Under a mesh of several devices the Pallas kernels run per batch shard in `jax.shard_map` (a
kernel cannot be partitioned by XLA), the blocks replicated.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging
from jax.sharding import PartitionSpec

from bert_flax import sharding
from bert_flax.block_sparse.layout import BlockSparseLayout
from bert_flax.kernels import block_sparse_cpu, block_sparse_gpu, block_sparse_tpu, block_sparse_xla

IMPLS = ("auto", "cpu", "xla", "pallas", "pallas_interpret", "pallas_tpu_interpret")
# Triton's dot needs tiles of at least 16; smaller blocks stay on the XLA path under "auto".
PALLAS_MIN_BLOCK = 16


def resolve_impl(impl: str | None, block_size: int, dtype=jnp.float32) -> str:
    """'auto'/None -> 'pallas' on GPU (blocks >= PALLAS_MIN_BLOCK) and TPU (blocks of 128), on the
    platform the program is for (`sharding.target_platform`); on CPU 'cpu' for float32 and the
    kernel's block sizes where the kernel builds (`block_sparse_cpu.build_error()`); else 'xla'.
    Logs the implementation once per process (and outcome), with the reason where 'auto' falls
    back to the XLA path."""
    impl = impl or "auto"
    if impl not in IMPLS:
        raise ValueError(f"Unknown block-sparse impl {impl!r}; choose one of {IMPLS}.")
    chosen, fallback = _auto(block_size, dtype) if impl == "auto" else (impl, None)
    _log_impl(chosen, fallback)
    return chosen


def _auto(block_size: int, dtype) -> tuple[str, str | None]:
    """'auto''s implementation, and why it is the XLA path where it falls back to it."""
    platform = sharding.target_platform()
    if platform == "tpu":
        if block_size == block_sparse_tpu.BLOCK:
            return "pallas", None
        return "xla", f"the TPU kernels take blocks of {block_sparse_tpu.BLOCK}, not {block_size}"
    if platform == "gpu":
        if block_size >= PALLAS_MIN_BLOCK:
            return "pallas", None
        return "xla", f"the GPU kernels take blocks of {PALLAS_MIN_BLOCK} or more, not {block_size}"
    if not block_sparse_cpu.supports(block_size, dtype):
        return "xla", (
            f"the CPU kernel takes float32 blocks of {block_sparse_cpu.BLOCK_SIZES}, "
            f"not {jnp.dtype(dtype).name} blocks of {block_size}"
        )
    error = block_sparse_cpu.build_error()
    if error is not None:
        return "xla", f"about 5x slower than the CPU kernel, which is unavailable: {error}"
    return "cpu", None


@functools.cache
def _log_impl(impl: str, fallback: str | None) -> None:
    if fallback is None:
        logging.info("Block-sparse layers use the %r implementation.", impl)
    else:
        logging.warning("Block-sparse layers use the XLA path: %s", fallback)


def block_sparse_matmul(
    x: jax.Array, blocks: jax.Array, layout: BlockSparseLayout, *, impl: str | None = None
) -> jax.Array:
    """x [..., in_features] @ W -> [..., out_features], W given by `layout` and `blocks`.

    Args:
      x: activations; the last dim must be `layout.in_features`.
      blocks: [nnz, block_size, block_size] nonzero blocks in the layout's canonical order
        (block n is W[rows[n]*bs:(rows[n]+1)*bs, cols[n]*bs:(cols[n]+1)*bs]).
      layout: the static block structure (hashable; part of the compiled program).
      impl: "auto" (default), "cpu", "xla", "pallas", or on CPU for tests "pallas_interpret"
        (the GPU kernels) and "pallas_tpu_interpret" (the TPU kernels).

    The output dtype is that of `x` (accumulation in float32); `blocks` are cast to it.
    """
    if x.shape[-1] != layout.in_features:
        raise ValueError(
            f"x has {x.shape[-1]} features, the layout expects in_features={layout.in_features}."
        )
    layout.check_blocks_shape(blocks.shape)
    impl = resolve_impl(impl, layout.block_size, x.dtype)
    blocks = blocks.astype(x.dtype)

    def rows_matmul(x: jax.Array, blocks: jax.Array) -> jax.Array:
        y = _matmul(x.reshape(-1, layout.in_features), blocks, layout, impl)
        return y.reshape(*x.shape[:-1], layout.out_features)

    if impl.startswith("pallas"):
        return _per_batch_shard(rows_matmul, x, blocks)
    return rows_matmul(x, blocks)


def _per_batch_shard(fn, x: jax.Array, blocks: jax.Array) -> jax.Array:
    """`fn(x, blocks)` on each batch shard of a multi-device mesh (the leading dim of `x` split
    as the rules split activation batches), the blocks replicated; plain `fn` elsewhere."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return fn(x, blocks)
    batch = nn.logical_to_mesh_axes((sharding.BATCH,))[0]
    spec = PartitionSpec(batch, *([None] * (x.ndim - 1)))
    return jax.shard_map(
        fn, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec, check_vma=False
    )(x, blocks)


def _forward_impl(x2, blocks, layout, impl):
    if impl == "cpu":
        return block_sparse_cpu.forward(x2, blocks, layout)
    if impl == "xla":
        return block_sparse_xla.forward(x2, blocks, layout, x2.dtype)
    return _pallas_module(impl).forward(x2, blocks, layout, interpret=impl != "pallas")


def _pallas_module(impl: str):
    """The Pallas kernels `impl` names: Mosaic's for TPU, Triton's otherwise."""
    tpu = impl == "pallas_tpu_interpret" or (
        impl == "pallas" and sharding.target_platform() == "tpu"
    )
    return block_sparse_tpu if tpu else block_sparse_gpu


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(x2, blocks, layout, impl):
    return _forward_impl(x2, blocks, layout, impl)


def _matmul_fwd(x2, blocks, layout, impl):
    return _forward_impl(x2, blocks, layout, impl), (x2, blocks)


def _matmul_bwd(layout, impl, residuals, g):
    x2, blocks = residuals
    g = g.astype(x2.dtype)
    if impl == "cpu":
        return block_sparse_cpu.backward(x2, blocks, g, layout)
    if impl == "xla":
        return block_sparse_xla.backward(x2, blocks, g, layout)
    return _pallas_module(impl).backward(x2, blocks, g, layout, interpret=impl != "pallas")


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def masked_dense_weight(blocks: jax.Array, layout: BlockSparseLayout) -> jax.Array:
    """The dense [in, out] weight (zeros off the layout) as a traced jnp array (references)."""
    bs = layout.block_size
    dense = jnp.zeros((layout.in_blocks, layout.out_blocks, bs, bs), blocks.dtype)
    dense = dense.at[layout.rows, layout.cols].set(blocks)
    return dense.transpose(0, 2, 1, 3).reshape(layout.in_features, layout.out_features)
