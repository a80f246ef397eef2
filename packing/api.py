"""``pack_histogram``: one entry point for every packing algorithm."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import numpy as np

from packing import greedy, lp, nnlshp
from packing import histogram as histogram_lib
from packing.strategy_set import StrategySet

PackFn = Callable[[np.ndarray, int, int], tuple[collections.Counter, dict]]


def _spfhp(hist, max_len, max_depth):
    return greedy.greedy_pack(hist, max_len, max_depth, "worst"), {}


def _lpfhp(hist, max_len, max_depth):
    return greedy.greedy_pack(hist, max_len, max_depth, "best"), {}


def _unpacked(hist, max_len, max_depth):
    del max_depth
    return collections.Counter({(k,): int(c) for k, c in enumerate(hist.tolist()) if c}), {}


ALGORITHMS: dict[str, PackFn] = {
    "none": _unpacked,
    "spfhp": _spfhp,
    "lpfhp": _lpfhp,
    "nnlshp": nnlshp.pack_nnlshp,
    "lp": lp.pack_lp,
}
# Algorithms that enumerate exact-fill patterns and so need a finite (small) depth.
NEEDS_FINITE_DEPTH = ("nnlshp",)
# The longest rows NNLSHP (at depth 3) is the default for. Past them LPFHP, about one sequence a
# DEPTH_TOKENS tokens deep: at 1,024 NNLSHP's enumeration takes 9-18 s and packs no better than
# LPFHP at depth 8, at 2,048-4,096 it runs past 20 s, at 8,192 it is refused; LPFHP takes under
# 0.05 s at every length and depth (benchmarks/results/packing_bench_long.json, docs/packing.md).
NNLSHP_MAX_LEN = 512
DEPTH_TOKENS = 128


def default_packing(max_len: int) -> tuple[str, int]:
    """The packer and depth for rows of ``max_len`` tokens: ("nnlshp", 3) up to NNLSHP_MAX_LEN,
    ("lpfhp", max_len // DEPTH_TOKENS) past it (8 at 1,024, 64 at 8,192)."""
    if max_len <= NNLSHP_MAX_LEN:
        return "nnlshp", 3
    return "lpfhp", max_len // DEPTH_TOKENS


def pack_histogram(
    histogram, max_len: int, algorithm: str = "nnlshp", max_depth: int | None = 3
) -> StrategySet:
    """Packs a length histogram into rows of ``max_len`` tokens.

    Args:
      histogram: counts per length (index = length, ``[0] == 0``), e.g. from
        :func:`packing.histogram.from_lengths` or :func:`packing.histogram.load_histogram`.
      max_len: tokens per row.
      algorithm: "spfhp", "lpfhp", "nnlshp", "lp" or "none" (one sequence per row).
      max_depth: most sequences per row; 0 or None = unlimited (not for "nnlshp").

    Returns:
      A :class:`StrategySet` whose strategies consume exactly the histogram.
    """
    hist = histogram_lib.validate_histogram(histogram, max_len)
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown packing algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}"
        )
    if isinstance(max_depth, bool) or (
        max_depth is not None and (not isinstance(max_depth, int | np.integer) or max_depth < 0)
    ):
        raise ValueError(f"max_depth must be an integer >= 0 (0 = unlimited), got {max_depth!r}")
    depth = int(max_depth or 0)
    if algorithm == "none":
        depth = 1
    if algorithm in NEEDS_FINITE_DEPTH and depth == 0:
        raise ValueError(
            f"{algorithm!r} enumerates exact-fill patterns and needs a finite max_depth "
            "(3 is usual); "
            "for unlimited depth use 'lp', 'lpfhp' or 'spfhp'"
        )
    start = time.perf_counter()
    packs, info = ALGORITHMS[algorithm](hist, max_len, depth)
    seconds = time.perf_counter() - start
    tokens = histogram_lib.total_tokens(hist)
    info = {"lower_bound_tokens": -(-tokens // max_len), **info}
    strategies = StrategySet.from_counter(
        packs,
        max_len=max_len,
        max_depth=depth,
        algorithm=algorithm,
        histogram_checksum=histogram_lib.histogram_checksum(hist),
        solve_seconds=seconds,
        info=info,
    )
    return strategies
