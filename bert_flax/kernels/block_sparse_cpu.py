"""The CPU kernel: block-sparse products in C++ (`block_sparse_cpu.cc`) through XLA's FFI.

The XLA path gathers each block column of the activations into a contiguous operand before its
batched matmul; this kernel reads the activations in place and keeps an output tile in registers,
so the work is the nonzero blocks' multiply-adds and nothing else (docs/block_sparse.md).

The source is compiled on first use with the C++ compiler on PATH (`$CXX`, else `c++`) for this
machine (`-march=native`) into a cache folder (`$BERT_FLAX_KERNEL_CACHE`, else
`~/.cache/bert_flax`), keyed by a hash of the source, the compiler and flags, jaxlib's version and
the compiler's predefined macros under those flags (the instruction sets `-march=native` enables
here, and the compiler's version): a cache shared by machines of different CPUs holds one library
per target, and none loads a build for instructions its CPU lacks. Later processes load the cached
library. `build_error()` says why that did not work (no compiler, another platform); then
`block_sparse_matmul(impl="auto")` keeps the XLA path (and logs why) and `impl="cpu"` raises with
the compiler's message. float32 only.

    python -m bert_flax.kernels.block_sparse_cpu  # build (or find) the library and print its path
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import subprocess
import tempfile
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

if TYPE_CHECKING:  # the layout is the layer's; the kernels read its index arrays
    from bert_flax.block_sparse.layout import BlockSparseLayout


SOURCE = os.path.join(os.path.dirname(__file__), "block_sparse_cpu.cc")
FLAGS = ("-O3", "-march=native", "-std=c++20", "-shared", "-fPIC", "-fno-math-errno")
BLOCK_SIZES = (8, 16, 32, 64)  # the block sizes the kernel is compiled for
_TARGETS = {"product": "BlockSparseGroupedProduct", "outer": "BlockSparseBlockOuter"}


def _cache_dir() -> str:
    default = os.path.join(os.path.expanduser("~"), ".cache", "bert_flax")
    return os.environ.get("BERT_FLAX_KERNEL_CACHE", default)


def _run_compiler(compiler: str, args: list[str]) -> str:
    """`compiler *args`'s stdout; RuntimeError with its message when it cannot run or fails."""
    command = [compiler, *args]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise RuntimeError(
            f"No C++ compiler found: cannot run {compiler!r} ($CXX): {error}. "
            "Install g++ or clang, or set $CXX."
        ) from error
    if result.returncode:
        raise RuntimeError(
            f"Compiling the block-sparse CPU kernel failed:\n  {shlex.join(command)}\n"
            f"{result.stderr.strip()}"
        )
    return result.stdout


def _native_target(compiler: str) -> str:
    """The compiler's predefined macros under FLAGS: what `-march=native` targets on this machine
    (`__AVX512F__`, `__znver4__`, ...) and the compiler's version."""
    return _run_compiler(compiler, [*FLAGS, "-dM", "-E", "-x", "c++", os.devnull])


def _library_path(compiler: str) -> str:
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read())
    key.update(" ".join((compiler, *FLAGS, jaxlib.__version__)).encode())
    key.update(_native_target(compiler).encode())
    return os.path.join(_cache_dir(), f"block_sparse_cpu_{key.hexdigest()[:16]}.so")


def build() -> str:
    """Compiles the kernel (unless cached) and returns the library's path; raises RuntimeError
    with the compiler's output when it cannot."""
    compiler = os.environ.get("CXX", "c++")
    path = _library_path(compiler)
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Compile to a temporary name, then rename: concurrent processes (test workers) never load
    # a half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        _run_compiler(compiler, [*FLAGS, "-I", jax.ffi.include_dir(), SOURCE, "-o", tmp])
    except RuntimeError:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)
    return path


@functools.cache
def _register() -> str | None:
    """Builds, loads and registers the FFI targets once; None, or why it failed."""
    try:
        library = ctypes.CDLL(build())
    except (RuntimeError, OSError) as error:
        return str(error)
    for name, symbol in _TARGETS.items():
        capsule = jax.ffi.pycapsule(getattr(library, symbol))
        jax.ffi.register_ffi_target(f"bert_flax_block_sparse_{name}", capsule, platform="cpu")
    return None


def build_error() -> str | None:
    """None where the kernel is built and registered (building it on first call), else why not."""
    return _register()


def _require() -> None:
    error = build_error()
    if error is not None:
        raise RuntimeError(f"The block-sparse CPU kernel is unavailable (use impl='xla'): {error}")


def supports(block_size: int, dtype) -> bool:
    """Whether the kernel has this block size and dtype (float32)."""
    return block_size in BLOCK_SIZES and jnp.dtype(dtype) == jnp.float32


def _check(layout: BlockSparseLayout, dtype) -> None:
    if layout.block_size not in BLOCK_SIZES:
        raise ValueError(
            f"The CPU kernel supports block sizes {BLOCK_SIZES}, not {layout.block_size}; "
            "use impl='xla'."
        )
    if jnp.dtype(dtype) != jnp.float32:
        raise ValueError(f"The CPU kernel computes in float32, not {dtype}; use impl='xla'.")


def _groups(layout: BlockSparseLayout, by: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ptr [groups + 1], src [nnz], blk [nnz]): the blocks of group g are slots ptr[g]:ptr[g+1]
    of src (the block row or column each reads) and blk (its canonical index)."""

    def build():
        if by == "out":  # canonical order is already by output column
            order, group, src = np.arange(layout.nnz), layout.cols, layout.rows
            groups = layout.out_blocks
        else:
            order = np.lexsort((layout.cols, layout.rows))
            group, src, groups = layout.rows[order], layout.cols[order], layout.in_blocks
        ptr = np.zeros(groups + 1, np.int32)
        np.cumsum(np.bincount(group, minlength=groups), out=ptr[1:])
        return ptr, src.astype(np.int32), order.astype(np.int32)

    return layout.cached(("cpu_groups", by), build)


def _product(a: jax.Array, w_blocks: jax.Array, layout: BlockSparseLayout, by: str) -> jax.Array:
    ptr, src, blk = _groups(layout, by)
    out_features = layout.out_features if by == "out" else layout.in_features
    call = jax.ffi.ffi_call(
        "bert_flax_block_sparse_product",
        jax.ShapeDtypeStruct((a.shape[0], out_features), jnp.float32),
        vmap_method="sequential",
    )
    return call(a, w_blocks, ptr, src, blk)


def forward(x2: jax.Array, blocks: jax.Array, layout: BlockSparseLayout) -> jax.Array:
    """y = x2 @ W for x2 [rows, in_features] float32."""
    _require()
    _check(layout, x2.dtype)
    return _product(x2, blocks, layout, "out")


def backward(
    x2: jax.Array, blocks: jax.Array, g2: jax.Array, layout: BlockSparseLayout
) -> tuple[jax.Array, jax.Array]:
    """(dx2 [rows, in], dblocks [nnz, bs, bs]) for the upstream gradient g2 [rows, out]."""
    _require()
    _check(layout, x2.dtype)
    dx = _product(g2, jnp.swapaxes(blocks, 1, 2), layout, "in")
    outer = jax.ffi.ffi_call(
        "bert_flax_block_sparse_outer",
        jax.ShapeDtypeStruct(layout.blocks_shape, jnp.float32),
        vmap_method="sequential",
    )
    return dx, outer(x2, g2, layout.rows, layout.cols)


if __name__ == "__main__":
    print(build())
