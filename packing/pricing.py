"""Pricing for column generation: the most valuable packing patterns by dynamic programming.

Given a value ``v[s]`` per sequence length ``s``, find multisets of lengths (patterns) with at most
``max_depth`` members (0 = unlimited) whose lengths sum to at most ``max_len`` (or exactly
``max_len``), maximizing the summed value. This is the pricing problem of Gilmore-Gomory column
generation for bin packing (values = LP duals) and of the NNLS active-set method (values = gradient
terms). A knapsack DP over (members, capacity) solves it in ``O(depth * max_len * lengths)``
vectorized steps, so no pattern is ever enumerated.
"""

from __future__ import annotations

import numpy as np

_NONE = -1
UNBOUNDED_LEVELS = 16  # past this many levels, a non-binding depth uses the unlimited DP


def best_patterns(
    values: np.ndarray,
    lengths: np.ndarray,
    max_len: int,
    max_depth: int,
    *,
    exact: bool = False,
    limit: int = 256,
) -> list[tuple[float, tuple[int, ...]]]:
    """Up to ``limit`` good patterns, best first, as (value, lengths ascending).

    For every length ``s`` (as a pattern's first member) the best completion is found, which gives
    many different strong columns from one DP.

    Args:
      values: value per entry of ``lengths``.
      lengths: distinct positive lengths allowed in patterns.
      max_len: capacity.
      max_depth: most members, 0 = unlimited.
      exact: patterns must sum to exactly ``max_len``.
      limit: most patterns returned.
    """
    lengths = np.asarray(lengths, np.int64)
    values = np.asarray(values, np.float64)
    most = max_len // int(lengths.min())  # no pattern can hold more members
    depth = min(max_depth, most) if max_depth else most
    if depth == most and depth - 1 > UNBOUNDED_LEVELS:  # depth cannot bind: one table by capacity
        table, choice = _unbounded_knapsack(values, lengths, max_len, exact)
        backtrack = _backtrack_unbounded
    else:
        table, choice = _knapsack(values, lengths, max_len, depth - 1, exact)
        backtrack = _backtrack
    # Completions of each first member s: best of depth-1 members in capacity max_len - s.
    found: dict[tuple[int, ...], float] = {}
    candidates = []
    for s, v in zip(lengths.tolist(), values.tolist()):
        if s <= max_len and np.isfinite(table[-1][max_len - s]):
            candidates.append((v + table[-1][max_len - s], s))
    candidates.sort(reverse=True)
    for value, s in candidates:
        pattern = tuple(sorted([s, *backtrack(choice, max_len - s)]))
        if pattern not in found:
            found[pattern] = value
            if len(found) >= limit:
                break
    return sorted(((v, p) for p, v in found.items()), key=lambda item: -item[0])


def _knapsack(values, lengths, max_len, levels, exact):
    """Tables f[k][c]: best value of at most k members with sum <= c (== c if exact)."""
    base = np.zeros(max_len + 1) if not exact else np.full(max_len + 1, -np.inf)
    base[0] = 0.0
    table = [base]
    choice = [np.full(max_len + 1, _NONE, np.int64)]
    for _ in range(levels):
        prev = table[-1]
        best = prev.copy()
        pick = np.full(max_len + 1, _NONE, np.int64)
        for s, v in zip(lengths.tolist(), values.tolist()):
            if s > max_len:
                continue
            candidate = prev[: max_len + 1 - s] + v
            better = candidate > best[s:]
            best[s:][better] = candidate[better]
            pick[s:][better] = s
        table.append(best)
        choice.append(pick)
    return table, choice


def _backtrack(choice, capacity: int) -> list[int]:
    members = []
    for k in range(len(choice) - 1, 0, -1):
        s = int(choice[k][capacity])
        if s != _NONE:
            members.append(s)
            capacity -= s
    return members


def _unbounded_knapsack(values, lengths, max_len, exact):
    """One table g[c]: best value of any number of members with sum <= c (== c if exact)."""
    g = np.full(max_len + 1, -np.inf)
    g[0] = 0.0
    pick = np.full(max_len + 1, _NONE, np.int64)
    order = np.argsort(lengths)
    lengths, values = lengths[order], values[order]
    for c in range(1, max_len + 1):
        usable = np.searchsorted(lengths, c, side="right")
        if not exact:
            g[c] = g[c - 1]
        if usable:
            candidate = values[:usable] + g[c - lengths[:usable]]
            i = int(np.argmax(candidate))
            if candidate[i] > g[c]:
                g[c] = candidate[i]
                pick[c] = lengths[i]
    return [g], pick


def _backtrack_unbounded(pick, capacity: int) -> list[int]:
    members = []
    while capacity > 0:
        s = int(pick[capacity])
        if s == _NONE:
            capacity -= 1  # inherited from a smaller capacity (only when not exact)
        else:
            members.append(s)
            capacity -= s
    return members
