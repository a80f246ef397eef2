"""Enumeration of packing patterns: multisets of lengths that fill a row of ``max_len`` exactly.

A pattern with a slot of length ``s`` may hold a sequence of any length ``<= s`` (the rest of
the slot becomes padding), so exact-fill patterns dominate every pack of at most the same
depth: grow the largest sequence of a pack until the row is full. This is the strategy matrix
of NNLSHP.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse

DEFAULT_MAX_PATTERNS = 2_000_000


def count_exact_patterns(max_len: int, max_depth: int) -> int:
    """Number of partitions of ``max_len`` into at most ``max_depth`` parts (exact)."""
    # p[k][n]: partitions of n into at most k parts.
    row = np.ones(max_len + 1, dtype=object)  # k = 1: one partition for every n
    for _ in range(2, max_depth + 1):
        new = row.copy()
        for n in range(max_len + 1):
            # partitions into at most k parts = into at most k-1 parts + into exactly k parts
            # (subtract 1 from each of the k parts): p(k, n) = p(k-1, n) + p(k, n-k)
            new[n] = row[n] + (new[n - _] if n >= _ else 0)
        row = new
    return int(row[max_len])


def exact_patterns(
    max_len: int, max_depth: int, max_patterns: int = DEFAULT_MAX_PATTERNS
) -> np.ndarray:
    """All sorted tuples of at most ``max_depth`` positive lengths summing to ``max_len``.

    Returns an int32 array ``[num_patterns, max_depth]``, each row descending and zero padded.

    Raises:
      ValueError: if there are more than ``max_patterns`` (the count grows like max_len^(d-1)).
    """
    if max_depth < 1:
        raise ValueError("exact patterns need a finite max_depth >= 1")
    count = count_exact_patterns(max_len, max_depth)
    if count > max_patterns:
        raise ValueError(
            f"{count:,} exact-fill patterns at max_len={max_len}, max_depth={max_depth} exceed "
            f"max_patterns={max_patterns:,}; use a smaller depth (3 is the usual choice), or "
            "'lp', 'lpfhp' or 'spfhp', which need no full enumeration"
        )
    rows = [np.array([[max_len]], np.int32)]
    # Build patterns with exactly k parts in descending order: parts[0] >= parts[1] >= ... >= 1.
    prefixes = np.zeros((1, 0), np.int32)
    for k in range(1, max_depth):
        # prefixes: first k parts (descending); next part <= the last, leaving room for one more.
        grown = []
        for prefix in _chunks(prefixes):
            used = prefix.sum(axis=1) if prefix.size else np.zeros(len(prefix), np.int64)
            last = prefix[:, -1] if prefix.shape[1] else np.full(len(prefix), max_len)
            for part in range(1, max_len):
                ok = (part <= last) & (used + part < max_len)
                if not ok.any():
                    continue
                sel = prefix[ok]
                grown.append(np.concatenate([sel, np.full((len(sel), 1), part, np.int32)], axis=1))
        prefixes = np.concatenate(grown) if grown else np.zeros((0, k), np.int32)
        # Complete each prefix with one last part when it keeps the order.
        rest = max_len - prefixes.sum(axis=1)
        keep = rest <= prefixes[:, -1]
        full = np.concatenate([prefixes[keep], rest[keep, None].astype(np.int32)], axis=1)
        rows.append(full)
    out = np.zeros((sum(len(r) for r in rows), max_depth), np.int32)
    start = 0
    for r in rows:
        out[start : start + len(r), : r.shape[1]] = r
        start += len(r)
    return out


def pattern_matrix(patterns: np.ndarray, max_len: int) -> scipy.sparse.csc_matrix:
    """Sparse ``[max_len, num_patterns]``: entry (l - 1, j) = copies of length l in pattern j."""
    rows, cols = np.nonzero(patterns)
    lengths = patterns[rows, cols]
    matrix = scipy.sparse.csc_matrix(
        (np.ones(lengths.size), (lengths - 1, rows)), shape=(max_len, len(patterns))
    )
    matrix.sum_duplicates()
    return matrix


def _chunks(array: np.ndarray, size: int = 1 << 16):
    for start in range(0, max(len(array), 1), size):
        yield array[start : start + size]


def lower_bound_packs(tokens: int, max_len: int) -> int:
    """Fewest packs any packing can use: all tokens in completely full rows."""
    return math.ceil(tokens / max_len)


def dominating_patterns(packs, patterns: np.ndarray, max_len: int) -> np.ndarray:
    """Indices of the exact-fill patterns that dominate ``packs`` (grow each largest part to fill).

    Packs deeper than the patterns are skipped. Used to warm-start the optimizing solvers from a
    greedy solution, which is close to optimal.
    """
    depth = patterns.shape[1]
    keys = _pattern_keys(patterns, max_len)
    order = np.argsort(keys)
    wanted = []
    for contents in packs:
        if not contents or len(contents) > depth:
            continue
        grown = sorted(contents, reverse=True)
        grown[0] += max_len - sum(grown)
        wanted.append(grown + [0] * (depth - len(grown)))
    if not wanted:
        return np.zeros(0, np.int64)
    wanted_keys = _pattern_keys(np.asarray(wanted, np.int64), max_len)
    pos = np.searchsorted(keys, wanted_keys, sorter=order)
    pos = np.minimum(pos, len(keys) - 1)
    found = keys[order[pos]] == wanted_keys
    return np.unique(order[pos[found]])


def _pattern_keys(rows: np.ndarray, max_len: int) -> np.ndarray:
    """One integer per descending zero-padded row (exact: Python ints if int64 could overflow)."""
    base = max_len + 1
    if base ** rows.shape[1] < 2**62:
        weights = base ** np.arange(rows.shape[1], dtype=np.int64)
        return rows.astype(np.int64) @ weights
    return np.array([sum(int(v) * base**i for i, v in enumerate(r)) for r in rows], dtype=object)
