"""Which key/value blocks each query block of a packed row can see, and the transpose.

A query attends only to keys of its own segment (`bert_flax.model.attention.segment_mask`), and
padding (segment 0) to nothing a kernel must compute. The keys a block of queries can see
therefore lie between the first token of its first real segment and the last token of its last:
with sequences packed as contiguous runs that is one range of key blocks, everything outside it
masked. A segment split into several runs widens the range to cover them all (more work, never a
wrong answer).

    lo, hi = kv_block_ranges(segment_ids, block_q=128, block_k=64)  # each [batch, L // 128]
    # query block i of row b visits key blocks lo[b, i] <= j < hi[b, i]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _segment_bounds(segment_ids: Array) -> tuple[Array, Array]:
    """Per token, the first position of its segment and one past the last ([batch, L] each)."""
    batch, length = segment_ids.shape
    rows = jnp.arange(batch)[:, None]
    positions = jnp.broadcast_to(jnp.arange(length), segment_ids.shape)
    # Indexed by segment id (ids 0..L: a row holds at most L sequences).
    first = jnp.full((batch, length + 1), length).at[rows, segment_ids].min(positions)
    last = jnp.zeros((batch, length + 1), jnp.int32).at[rows, segment_ids].max(positions + 1)
    take = jax.vmap(lambda table, ids: table[ids])
    return take(first, segment_ids), take(last, segment_ids)


def kv_block_ranges(segment_ids: Array, block_q: int, block_k: int) -> tuple[Array, Array]:
    """Per (row, query block of `block_q`), the first key block (of `block_k`) any of its real
    queries can see and one past the last: two int32 [batch, L // block_q]. A block of padding
    only gets the empty range (0, 0)."""
    batch, length = segment_ids.shape
    start, end = _segment_bounds(segment_ids)
    real = (segment_ids != 0).reshape(batch, length // block_q, block_q)
    start = jnp.where(real, start.reshape(real.shape), length).min(-1)
    end = jnp.where(real, end.reshape(real.shape), 0).max(-1)
    lo = jnp.where(end > 0, start // block_k, 0)
    hi = -(-end // block_k)  # ceil
    return lo.astype(jnp.int32), hi.astype(jnp.int32)


def q_block_ranges(segment_ids: Array, block_q: int, block_k: int) -> tuple[Array, Array]:
    """Per (row, key block of `block_k`), the query blocks (of `block_q`) whose queries see any
    of its keys: two int32 [batch, L // block_k]. The segment mask is symmetric, so these are
    `kv_block_ranges` with the two roles swapped."""
    return kv_block_ranges(segment_ids, block_q=block_k, block_k=block_q)
