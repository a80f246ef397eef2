"""Linear-programming packers: the covering LP over exact-fill patterns, its bound and rounding.

The LP: minimize the number of packs ``sum_j x_j`` over pattern copies ``x >= 0`` such that, for
every length ``l``, the slots of length ``>= l`` number at least the sequences of length ``>= l``
(the condition under which longest-first matching packs everything). Written with "downgrade"
variables ``y_l`` (slots of length ``l`` handed to length ``l - 1``) the matrix stays sparse:
``(A x)_l + y_{l+1} - y_l >= h_l``. Over exact-fill patterns of depth ``<= d`` this is the LP
relaxation of bin packing with at most ``d`` sequences per bin, so ``ceil`` of its optimum is a
lower bound on the packs of *any* packing of that depth. Solved with HiGHS
(``scipy.optimize.linprog``).
"""

from __future__ import annotations

import collections
import math
import time

import numpy as np
import scipy.optimize
import scipy.sparse

from packing import greedy, nnlshp, pricing, rounding
from packing import histogram as histogram_lib
from packing import patterns as patterns_lib

_EPS = 1e-6
COLUMNS_PER_ROUND = 512  # most negative reduced costs added per column-generation round
ENUMERATION_DEPTH = 3  # deepest LP solved over all enumerated exact-fill patterns


def covering_matrix(patterns: np.ndarray, max_len: int) -> scipy.sparse.csc_matrix:
    """``[A | D]``: slot counts per length and the downgrade chain (``max_len - 1`` columns)."""
    slots = patterns_lib.pattern_matrix(patterns, max_len)
    # y_k: slots of length k + 1 serving length k, -1 in row k (length k + 1), +1 in row k - 1.
    k = np.arange(1, max_len)
    chain = scipy.sparse.csc_matrix(
        (
            np.concatenate([-np.ones(max_len - 1), np.ones(max_len - 1)]),
            (np.concatenate([k, k - 1]), np.concatenate([k - 1, k - 1])),
        ),
        shape=(max_len, max_len - 1),
    )
    return scipy.sparse.hstack([slots, chain], format="csc")


def solve_covering_lp(
    hist: np.ndarray,
    max_len: int,
    patterns: np.ndarray,
    initial_columns: np.ndarray | None = None,
    *,
    max_rounds: int = 100,
) -> tuple[np.ndarray, float, float, int]:
    """Covering LP by column generation over enumerated patterns.

    The restricted LP holds a growing working set of patterns and the whole downgrade chain; the
    duals ``pi`` price every pattern at once (reduced cost ``1 - A^T pi``) and the most negative
    ones join the working set. Stops when none is negative (the restricted optimum is optimal) or
    when the Farley bound ``z / max_j (A^T pi)_j`` already proves the integer bound ``ceil(z)``.

    Returns:
      (pattern copies x, restricted LP value z, proven lower bound on the LP optimum, rounds).
    """
    matrix = covering_matrix(patterns, max_len)
    num_patterns = len(patterns)
    slots = matrix[:, :num_patterns]
    chain = matrix[:, num_patterns:]
    demand = -hist[1:].astype(float)
    work = (
        np.arange(num_patterns)
        if initial_columns is None
        else np.union1d(initial_columns, np.flatnonzero((patterns > 0).sum(axis=1) == 1))
    )
    tokens_bound = patterns_lib.lower_bound_packs(int(np.arange(len(hist)) @ hist), max_len)
    for rounds in range(1, max_rounds + 1):  # noqa: B007
        restricted = scipy.sparse.hstack([slots[:, work], chain], format="csc")
        cost = np.concatenate([np.ones(len(work)), np.zeros(max_len - 1)])
        result = scipy.optimize.linprog(
            cost, A_ub=-restricted, b_ub=demand, bounds=(0, None), method="highs-ds"
        )
        if result.status != 0:
            raise RuntimeError(f"covering LP failed: {result.message}")
        solved = work
        value = slots.T @ -result.ineqlin.marginals
        bound = result.fun / max(1.0, float(value.max()))
        reduced = 1.0 - value
        reduced[work] = np.inf
        entering = np.flatnonzero(reduced < -_EPS)
        proven = math.ceil(result.fun - _EPS) <= max(math.ceil(bound - _EPS), tokens_bound)
        if entering.size == 0 or proven:
            break
        top = entering[np.argsort(reduced[entering])[:COLUMNS_PER_ROUND]]
        work = np.union1d(work, top)  # never drop columns: no cycling on degenerate duals
    x = np.zeros(num_patterns)
    x[solved] = np.maximum(result.x[: len(solved)], 0.0)
    return x, float(result.fun), (float(result.fun) if entering.size == 0 else bound), rounds


def lp_lower_bound(lp_value: float, tokens: int, max_len: int) -> int:
    """The best valid lower bound on packs: ceil of the LP optimum and of tokens / max_len."""
    return max(math.ceil(lp_value - _EPS), patterns_lib.lower_bound_packs(tokens, max_len))


def lower_bound(histogram, max_len: int, max_depth: int | None = 3) -> int:
    """Fewest packs any packing of ``histogram`` at this depth (0 or None = unlimited) can use.

    The covering LP's optimum rounded up, never less than ``ceil(tokens / max_len)``; compare a
    strategy set's ``num_packs`` with it to see how far from optimal it is.
    """
    _, info = pack_lp(histogram_lib.validate_histogram(histogram, max_len), max_len, max_depth or 0)
    return info["lower_bound"]


def pack_lp(hist: np.ndarray, max_len: int, max_depth: int, *, time_limit: float = 60.0):
    """Covering LP, rounding, realization and repair. Returns (packs Counter, info dict).

    Depth <= 3: the LP over all exact-fill patterns (enumerated; priced by one sparse product).
    Deeper or unlimited: that depth-3 solution warm-starts column generation with knapsack pricing
    at the requested depth (on SQuAD and Wikipedia-like data the first pricing round already proves
    the depth-3 LP optimal for any depth). When the enumeration would be too large (long rows),
    column generation starts from the LPFHP packs instead.
    """
    base_depth = min(max_depth, ENUMERATION_DEPTH) if max_depth else ENUMERATION_DEPTH
    tokens = int(np.arange(len(hist)) @ hist)
    info: dict = {}
    candidates: list[tuple[collections.Counter, str]] = []
    for fit, name in (("best", "lpfhp"), ("worst", "spfhp")):  # never worse than the greedy
        candidates.append((greedy.greedy_pack(hist, max_len, max_depth, fit), name))
    seeds = list(candidates[0][0])
    if patterns_lib.count_exact_patterns(max_len, base_depth) <= patterns_lib.DEFAULT_MAX_PATTERNS:
        pats = patterns_lib.exact_patterns(max_len, base_depth)
        start = nnlshp.warm_start_columns(hist, max_len, pats)
        x, value, bound, rounds = solve_covering_lp(hist, max_len, pats, start)
        packs, how = rounding.round_and_repair(pats, x, hist, max_len, max_depth)
        candidates.append((packs, how))
        seeds += list(packs)
        info.update(lp_value=value, lp_depth=base_depth, lp_rounds=rounds, columns=len(pats))
        if base_depth == max_depth:
            info["lower_bound"] = lp_lower_bound(bound, tokens, max_len)
    if "lower_bound" not in info:
        columns, x, value, bound, rounds = solve_lp_by_pricing(
            hist, max_len, max_depth, seeds, time_limit=time_limit
        )
        packs, how = rounding.round_and_repair(columns, x, hist, max_len, max_depth)
        candidates.append((packs, f"{how} (column generation)"))
        info.update(lp_value=value, lp_depth=max_depth, pricing_rounds=rounds)
        info["lower_bound"] = lp_lower_bound(bound, tokens, max_len)
    packs, how = min(candidates, key=lambda c: sum(c[0].values()))
    info["chosen"] = how
    return packs, info


def solve_lp_by_pricing(
    hist: np.ndarray,
    max_len: int,
    max_depth: int,
    initial: list[tuple[int, ...]],
    *,
    max_rounds: int = 500,
    time_limit: float = 60.0,
) -> tuple[list[tuple[int, ...]], np.ndarray, float, float, int]:
    """Gilmore-Gomory column generation with knapsack pricing (any depth, no enumeration).

    Rows are the lengths present; patterns are multisets of them with sum <= max_len and at most
    ``max_depth`` members. Stops when no pattern prices out or when the Farley bound
    ``z / max_value`` proves the integer bound ``ceil(z)`` already, or after ``time_limit``
    seconds (the restricted solution is still a valid packing and the bound still valid).

    Returns:
      (patterns, copies x, LP value z, proven lower bound on z, rounds).
    """
    lengths = np.flatnonzero(hist)
    row_of = {int(s): i for i, s in enumerate(lengths)}
    demand = hist[lengths].astype(float)
    columns = {tuple(sorted(p)) for p in initial if p}
    columns |= {(int(s),) for s in lengths}
    columns = sorted(columns)
    bound = 0.0
    tokens_bound = patterns_lib.lower_bound_packs(int(np.arange(len(hist)) @ hist), max_len)
    deadline = time.perf_counter() + time_limit
    # Downgrade chain over the lengths present: a slot of length lengths[i + 1] may hold lengths[i].
    n = len(lengths)
    k = np.arange(n - 1)
    chain = scipy.sparse.csc_matrix(
        (np.r_[-np.ones(n - 1), np.ones(n - 1)], (np.r_[k + 1, k], np.r_[k, k])), shape=(n, n - 1)
    )
    for rounds in range(1, max_rounds + 1):  # noqa: B007
        matrix = scipy.sparse.hstack([_pattern_columns(columns, row_of, n), chain], format="csc")
        cost = np.r_[np.ones(len(columns)), np.zeros(n - 1)]
        result = scipy.optimize.linprog(
            cost, A_ub=-matrix, b_ub=-demand, bounds=(0, None), method="highs-ds"
        )
        if result.status != 0:
            raise RuntimeError(f"covering LP failed: {result.message}")
        solved = columns
        duals = np.maximum(-result.ineqlin.marginals, 0.0)
        priced = pricing.best_patterns(duals, lengths, max_len, max_depth, limit=COLUMNS_PER_ROUND)
        best_value = priced[0][0] if priced else 0.0
        bound = max(bound, result.fun / max(best_value, 1.0))
        known = set(columns)
        entering = [p for v, p in priced if v > 1.0 + 1e-9 and p not in known]
        proven = math.ceil(result.fun - _EPS) <= max(math.ceil(bound - _EPS), tokens_bound)
        if not entering or proven or time.perf_counter() > deadline:
            break
        columns = sorted(known | set(entering))  # never drop columns: no cycling
    return solved, np.maximum(result.x[: len(solved)], 0.0), float(result.fun), bound, rounds


def _pattern_columns(columns, row_of, num_rows) -> scipy.sparse.csc_matrix:
    rows, cols = [], []
    for j, pattern in enumerate(columns):
        for s in pattern:
            rows.append(row_of[s])
            cols.append(j)
    matrix = scipy.sparse.csc_matrix(
        (np.ones(len(rows)), (rows, cols)), shape=(num_rows, len(columns))
    )
    matrix.sum_duplicates()
    return matrix
