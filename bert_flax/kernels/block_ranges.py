"""Which blocks of a packed row's attention a kernel must visit, computed once a row.

In a packed row each sequence is one contiguous run of its segment id (1..k, in any order, each
id one run: `bert_flax.input_pipeline.rows` builds them so); padding, id 0, attends to nothing
(its outputs are zero). The keys that the queries of a query block can see therefore form one
range of tokens: from the start of the first sequence present in the block to the end of the
last. Every key/value block outside it is fully masked and a kernel skips it; by symmetry, each
key/value block needs only the query blocks that overlap its own sequences (the backward pass's
dK, dV). A block of padding alone visits nothing: its range is empty, (0, 0).

An optional sliding `window` (tokens, positive and even; None: global attention) narrows what a
query sees to the keys of its sequence within `window // 2` tokens of it, either side (ModernBERT's
`local_attention`): a query block's range is then its sequences' range intersected with
[block start - window // 2, block end + window // 2), and the kernels skip the blocks outside it.

    >>> segment_ids = jnp.array([[1] * 100 + [2] * 200 + [0] * 212])  # a row of 512
    >>> first, stop = kv_ranges(segment_ids, block_q=128, block_k=128)
    >>> first.tolist(), stop.tolist()  # the kv blocks [first, stop) of each query block
    ([[0, 0, 0, 0]], [[3, 3, 3, 0]])
    >>> first, stop = kv_ranges(segment_ids, block_q=128, block_k=128, window=64)
    >>> first.tolist(), stop.tolist()  # 32 tokens either side
    ([[0, 0, 1, 0]], [[2, 3, 3, 0]])
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def check_block_sizes(length: int, block_q: int, block_k: int) -> None:
    """ValueError, naming the fix, unless both block sizes divide the row `length`."""
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if block <= 0 or length % block:
            raise ValueError(
                f"The attention kernel's {name}={block} does not divide the row length "
                f"{length}; choose a block size that divides it (or a row length that is a "
                "multiple of it)."
            )


def check_window(window: int | None) -> None:
    """ValueError, naming the fix, unless `window` is None (global attention) or a positive even
    number of tokens."""
    if window is None:
        return
    whole = isinstance(window, numbers.Integral) and not isinstance(window, bool)
    if not whole or window <= 0 or window % 2:
        raise ValueError(
            f"The attention window must be a positive even number of tokens (window // 2 each "
            f"side), got window={window!r}; use e.g. 128, or None for global attention."
        )


def within_window(q_index: Array, k_index: Array, window: int) -> Array:
    """Where query `q_index` is within `window // 2` tokens of key `k_index` (int32 indices of
    one row, broadcast together): the sliding window's mask."""
    half = window // 2
    return (q_index - k_index <= half) & (k_index - q_index <= half)


def _key_bounds(segment_ids: Array, window: int | None) -> tuple[Array, Array]:
    """[batch, L] each: the first key each token sees and one past its last: its sequence's
    first token and one past its last, within `window // 2` tokens of it."""
    length = segment_ids.shape[1]
    position = jnp.arange(length, dtype=jnp.int32)
    change = segment_ids[:, 1:] != segment_ids[:, :-1]
    edge = jnp.ones_like(change[:, :1])
    starts_run = jnp.concatenate([edge, change], axis=1)
    ends_run = jnp.concatenate([change, edge], axis=1)
    start = jax.lax.cummax(jnp.where(starts_run, position, 0), axis=1)
    end = jax.lax.cummin(jnp.where(ends_run, position + 1, length), axis=1, reverse=True)
    if window is not None:
        start = jnp.maximum(start, position - window // 2)
        end = jnp.minimum(end, position + window // 2 + 1)
    return start, end


def kv_ranges(
    segment_ids: Array, block_q: int, block_k: int, window: int | None = None
) -> tuple[Array, Array]:
    """The key/value blocks each query block must visit: `(first, stop)`, int32
    [batch, L // block_q] each, the half-open range of kv block indices (of `block_k` tokens)
    holding every key that a query of the block can see (within `window // 2` tokens of it
    unless `window` is None); (0, 0) for a block of padding alone.

    `segment_ids`: int32 [batch, L], each sequence one contiguous run of its id, 0 padding.
    """
    batch, length = segment_ids.shape
    check_block_sizes(length, block_q, block_k)
    check_window(window)
    start, end = _key_bounds(segment_ids, window)
    real = segment_ids != 0
    lo = jnp.where(real, start, length).reshape(batch, -1, block_q).min(axis=-1)
    hi = jnp.where(real, end, 0).reshape(batch, -1, block_q).max(axis=-1)
    empty = hi == 0
    first = jnp.where(empty, 0, lo // block_k)
    stop = jnp.where(empty, 0, -(-hi // block_k))
    return first.astype(jnp.int32), stop.astype(jnp.int32)


def q_ranges(
    segment_ids: Array, block_q: int, block_k: int, window: int | None = None
) -> tuple[Array, Array]:
    """The transpose of `kv_ranges`, for the backward pass's dK and dV: the query blocks (of
    `block_q` tokens) whose queries see a key of each kv block (of `block_k`), `(first, stop)`,
    int32 [batch, L // block_k] each. The mask (window included) is symmetric, so it is
    `kv_ranges` with the blocks' roles swapped."""
    return kv_ranges(segment_ids, block_q=block_k, block_k=block_q, window=window)


def visited_fraction(
    segment_ids: Array, block_q: int, block_k: int, window: int | None = None
) -> Array:
    """The fraction of all (query block, kv block) pairs of the rows that a kernel skipping by
    `kv_ranges` visits (float32 scalar): its share of dense attention's FLOPs and K/V bytes."""
    first, stop = kv_ranges(segment_ids, block_q, block_k, window)
    num_kv_blocks = segment_ids.shape[1] // block_k
    return jnp.sum(stop - first) / (first.size * num_kv_blocks)


_ROWS_AT_ONCE = 1024  # rows of segment ids built at a time (32 MiB at 8,192 tokens)


def expected_visited_fraction(
    rows: Iterable[tuple[Sequence[int], int]],
    length: int,
    block_q: int,
    block_k: int,
    window: int | None = None,
) -> float:
    """`visited_fraction` (with `window`) over rows of `length` tokens described by their
    sequences' lengths: each `(lengths, count)` is `count` rows holding sequences of `lengths`
    one after another from the row's start, in that order, then padding (a packing's strategies;
    a padded row holds one). The expected share of dense attention's block pairs a skipping
    kernel visits."""
    visited = total = 0.0
    rows = list(rows)
    for start in range(0, len(rows), _ROWS_AT_ONCE):
        chunk = rows[start : start + _ROWS_AT_ONCE]
        segment_ids = np.zeros((len(chunk), length), np.int32)
        for row, (lengths, _) in zip(segment_ids, chunk):
            ids = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)
            row[: ids.size] = ids
        first, stop = kv_ranges(jnp.asarray(segment_ids), block_q, block_k, window)
        counts = np.array([count for _, count in chunk], np.float64)
        visited += float(counts @ np.asarray(stop - first).sum(axis=1))
        total += counts.sum() * (length // block_q) * (length // block_k)
    return float(visited / total) if total else 1.0
