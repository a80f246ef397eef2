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

import math

import numpy as np
import scipy.optimize
import scipy.sparse

from packing import nnlshp, rounding
from packing import patterns as patterns_lib

_EPS = 1e-6
COLUMNS_PER_ROUND = 512  # most negative reduced costs added per column-generation round


def covering_matrix(patterns: np.ndarray, max_len: int) -> scipy.sparse.csc_matrix:
    """``[A | D]``: slot counts per length and the downgrade chain (``max_len - 1`` columns)."""
    slots = patterns_lib.pattern_matrix(patterns, max_len)
    k = np.arange(
        1, max_len
    )  # y for slot length k + 1 serving length k: row k (length k+1) -1, row k-1 +1
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
) -> tuple[np.ndarray, float, int]:
    """Covering LP by column generation. Returns (pattern copies x, LP optimum in packs, rounds).

    The restricted LP holds a working set of patterns and the whole downgrade chain; the duals
    ``pi`` price every pattern at once (reduced cost ``1 - A^T pi``) and the most negative ones join
    the working set until none is left, which proves the restricted optimum optimal for all.
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
    for rounds in range(1, max_rounds + 1):  # noqa: B007
        restricted = scipy.sparse.hstack([slots[:, work], chain], format="csc")
        cost = np.concatenate([np.ones(len(work)), np.zeros(max_len - 1)])
        result = scipy.optimize.linprog(
            cost, A_ub=-restricted, b_ub=demand, bounds=(0, None), method="highs-ds"
        )
        if result.status != 0:
            raise RuntimeError(f"covering LP failed: {result.message}")
        duals = -result.ineqlin.marginals
        reduced = 1.0 - slots.T @ duals
        reduced[work] = np.inf
        entering = np.flatnonzero(reduced < -_EPS)
        if entering.size == 0:
            break
        top = entering[np.argsort(reduced[entering])[:COLUMNS_PER_ROUND]]
        work = np.union1d(work[result.x[: len(work)] > 0], top)
    x = np.zeros(num_patterns)
    x[work] = np.maximum(result.x[: len(work)], 0.0)
    return x, float(result.fun), rounds


def solve_covering_milp(
    hist: np.ndarray, max_len: int, patterns: np.ndarray, time_limit: float
) -> np.ndarray | None:
    """Integer pattern copies from HiGHS branch and bound, or None if no solution in time."""
    matrix = covering_matrix(patterns, max_len)
    n = len(patterns)
    cost = np.concatenate([np.ones(n), np.zeros(max_len - 1)])
    integrality = np.concatenate([np.ones(n), np.zeros(max_len - 1)])
    constraint = scipy.optimize.LinearConstraint(matrix, lb=hist[1:].astype(float), ub=np.inf)
    result = scipy.optimize.milp(
        cost,
        constraints=constraint,
        integrality=integrality,
        bounds=scipy.optimize.Bounds(0, np.inf),
        options={"time_limit": time_limit, "mip_rel_gap": 1e-7, "disp": False},
    )
    if result.x is None:
        return None
    return np.rint(result.x[:n]).astype(np.int64)


def lp_lower_bound(lp_value: float, tokens: int, max_len: int) -> int:
    """The best valid lower bound on packs: ceil of the LP optimum and of tokens / max_len."""
    return max(math.ceil(lp_value - _EPS), patterns_lib.lower_bound_packs(tokens, max_len))


def pack_lp(hist: np.ndarray, max_len: int, max_depth: int, *, milp_seconds: float = 0.0):
    """Covering LP, floor rounding, realization and repair. Returns (packs Counter, info dict)."""
    pats = patterns_lib.exact_patterns(max_len, max_depth)
    x, lp_value, rounds = solve_covering_lp(
        hist, max_len, pats, nnlshp.warm_start_columns(hist, max_len, pats)
    )
    copies = np.floor(x + _EPS).astype(np.int64)
    packs, residual = rounding.realize(pats, copies, hist, max_len)
    packs = rounding.repair(packs, residual, max_len, max_depth)
    tokens = sum(sum(c) * n for c, n in packs.items())
    info = {
        "lp_value": lp_value,
        "lower_bound": lp_lower_bound(lp_value, tokens, max_len),
        "columns": len(pats),
        "lp_rounds": rounds,
        "rounding": "floor+repair",
    }
    if milp_seconds > 0:
        integer = solve_covering_milp(hist, max_len, pats, milp_seconds)
        if integer is not None and integer.sum() < sum(packs.values()):
            milp_packs, milp_residual = rounding.realize(pats, integer, hist, max_len)
            milp_packs = rounding.repair(milp_packs, milp_residual, max_len, max_depth)
            if sum(milp_packs.values()) < sum(packs.values()):
                packs = milp_packs
                info["rounding"] = "milp"
    return packs, info
