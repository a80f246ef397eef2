"""The machine's roofline ceilings, measured in the same process as the profile.

Peak compute is the best FLOP rate of square matrix products in the step's matmul dtype;
peak bandwidth is the byte rate of one large elementwise stream (read x, write x + 1). Sizes grow
until one run takes `min_seconds`, so the same code fits a laptop CPU and an accelerator.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Ceilings:
    flops_per_s: float
    bytes_per_s: float
    matmul_dtype: str
    matmul_size: int
    stream_bytes: int

    @property
    def ridge_intensity(self) -> float:
        """FLOP/byte at which the roofline turns from memory- to compute-bound."""
        return self.flops_per_s / self.bytes_per_s


def _best_time(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def measure_matmul(dtype="float32", *, min_seconds: float = 0.05, max_size: int = 16384):
    """(best FLOP/s, its n) of n x n x n products, doubling n from 256 until one product takes
    `min_seconds`; the best rate over the sizes is the ceiling (mid sizes can beat large ones
    that spill out of cache)."""
    matmul = jax.jit(jnp.matmul)
    n, best = 256, (0.0, 256)
    while True:
        key_a, key_b = jax.random.split(jax.random.key(n))
        a = jax.random.normal(key_a, (n, n), dtype)
        b = jax.random.normal(key_b, (n, n), dtype)
        seconds = _best_time(matmul, a, b, repeats=5)
        best = max(best, (2.0 * n**3 / seconds, n))
        if seconds >= min_seconds or n >= max_size:
            return best
        n *= 2


def measure_stream(*, min_seconds: float = 0.02, min_bytes: int = 2**26, max_bytes: int = 2**30):
    """(bytes/s, array bytes) of x <- x + 1 in place on float32, counting bytes read and written.

    The array starts at `min_bytes` (past the caches) and the update donates its input, so the
    timing is memory traffic rather than page faults on a fresh output buffer.
    """
    stream = jax.jit(lambda x: x + 1.0, donate_argnums=0)
    size = min_bytes // 4
    while True:
        x = stream(jnp.zeros((size,), jnp.float32))
        jax.block_until_ready(x)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            x = jax.block_until_ready(stream(x))
            best = min(best, time.perf_counter() - start)
        del x
        if best >= min_seconds or size * 4 >= max_bytes:
            return 2.0 * size * 4 / best, size * 4
        size *= 4


def measure(matmul_dtype="float32", *, min_seconds: float = 0.05) -> Ceilings:
    flops, n = measure_matmul(matmul_dtype, min_seconds=min_seconds)
    bandwidth, nbytes = measure_stream(min_seconds=min_seconds / 2)
    return Ceilings(flops, bandwidth, str(jnp.dtype(matmul_dtype)), n, nbytes)
