"""Assigning real sequences (by index) to packs that follow a strategy set."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from packing import greedy
from packing.strategy_set import StrategySet


@dataclasses.dataclass
class Assignment:
    """Packs of sequence indices.

    Attributes:
      packs: one list of indices (into the ``lengths`` given) per pack, in a random order fixed by
        the seed; within a pack, indices are ordered by length.
      dropped: indices left out; empty unless ``drop_unassigned=True`` was asked for.
      fallback_packs: packs made by the fallback for sequences no strategy covered (the last
        ones built).
    """

    packs: list[list[int]]
    dropped: list[int]
    fallback_packs: int

    @property
    def strategy_packs(self) -> int:
        return len(self.packs) - self.fallback_packs


def plan_packs(
    counts: np.ndarray, strategy_set: StrategySet, *, fallback: str = "spfhp"
) -> tuple[list[tuple[tuple[int, ...], int]], list[tuple[tuple[int, ...], int]], np.ndarray]:
    """How many packs of each strategy sequences with these per-length ``counts`` allow (each
    strategy used as often as the counts allow, up to its count, in the set's order), the
    fallback packs of what is left (by the packing algorithm ``fallback``, at the set's
    ``max_depth``: "spfhp", worst fit, is instant; "lp" is near-optimal and takes up to a few
    tenths of a second at 512), and that leftover per length. Histogram arithmetic only: what
    ``assign_sequences`` builds, and its pack count (``count_packs``), without touching a
    sequence."""

    def use(strategies, available: np.ndarray) -> list[tuple[tuple[int, ...], int]]:
        used = []
        for contents, count in strategies:
            multiplicity = collections.Counter(contents)
            n = int(min(count, min(available[k] // m for k, m in multiplicity.items())))
            if n > 0:
                for k, m in multiplicity.items():
                    available[k] -= n * m
                used.append((tuple(contents), n))
        return used

    leftover = np.asarray(counts, np.int64).copy()
    planned = use(strategy_set.strategies, leftover)
    extra: list[tuple[tuple[int, ...], int]] = []
    if leftover.any() and fallback == "spfhp":
        greedy_packs = greedy.greedy_pack(
            leftover, strategy_set.max_len, strategy_set.max_depth, "worst"
        )
        extra = use(sorted(greedy_packs.items()), leftover.copy())
    elif leftover.any():
        from packing import api  # the packers' entry point imports this module

        solved = api.pack_histogram(
            leftover, strategy_set.max_len, fallback, strategy_set.max_depth
        )
        extra = use(solved.strategies, leftover.copy())
    return planned, extra, leftover


def count_packs(counts: np.ndarray, strategy_set: StrategySet, *, fallback: str = "spfhp") -> int:
    """The number of packs ``assign_sequences`` makes for sequences with these per-length
    ``counts`` (index = length), e.g. to locate a position in a stream without packing it."""
    planned, extra, _ = plan_packs(counts, strategy_set, fallback=fallback)
    return sum(n for _, n in planned) + sum(n for _, n in extra)


def assign_sequences(
    lengths,
    strategy_set: StrategySet,
    *,
    drop_unassigned: bool = False,
    seed: int = 0,
    fallback: str = "spfhp",
) -> Assignment:
    """Builds packs of example indices following ``strategy_set``.

    The lengths may come from data other than the histogram the strategies were solved for (another
    shard, another epoch): each strategy is used as often as the examples allow, up to its count.
    Examples no strategy covers are packed on their own histogram by ``fallback`` (SPFHP by
    default; see ``plan_packs``), unless ``drop_unassigned`` is set, in which case they are
    returned in ``Assignment.dropped``. Which examples of equal length share a pack, and the
    order of the packs, are random with ``seed``.

    Raises:
      ValueError: if a length is not an integer in ``1..strategy_set.max_len``.
    """
    values = _check_lengths(lengths, strategy_set.max_len)
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(values.size)
    order = shuffled[np.argsort(values[shuffled], kind="stable")]  # by length, random within length
    starts = np.searchsorted(values[order], np.arange(strategy_set.max_len + 2))
    taken = np.zeros(strategy_set.max_len + 1, np.int64)  # indices used so far, per length

    def build(strategies) -> list[list[int]]:
        built = []
        for contents, n in strategies:
            multiplicity = collections.Counter(contents)
            columns = []
            for k, m in sorted(multiplicity.items()):
                begin = starts[k] + taken[k]
                columns.append(order[begin : begin + n * m].reshape(n, m))
                taken[k] += n * m
            built.extend(np.concatenate(columns, axis=1).tolist())
        return built

    counts = np.bincount(values, minlength=strategy_set.max_len + 1)
    planned, fallback_plan, leftover = plan_packs(counts, strategy_set, fallback=fallback)
    packs = build(planned)
    dropped: list[int] = []
    fallback: list[list[int]] = []
    if drop_unassigned:
        left = [order[starts[k] + taken[k] : starts[k + 1]] for k in np.flatnonzero(leftover)]
        dropped = np.sort(np.concatenate(left)).tolist() if left else []
    else:
        fallback = build(fallback_plan)
    packs.extend(fallback)
    permutation = rng.permutation(len(packs))
    return Assignment(
        packs=[packs[i] for i in permutation], dropped=dropped, fallback_packs=len(fallback)
    )


def _check_lengths(lengths, max_len: int) -> np.ndarray:
    values = np.asarray(lengths)
    if values.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {values.shape}")
    if values.size == 0:
        return values.astype(np.int64)
    if not np.issubdtype(values.dtype, np.integer):
        if not np.issubdtype(values.dtype, np.floating) or np.any(values != np.round(values)):
            raise ValueError(f"lengths must be integers, got dtype {values.dtype}")
    values = values.astype(np.int64)
    bad = np.flatnonzero((values < 1) | (values > max_len))
    if bad.size:
        raise ValueError(
            f"{bad.size} lengths are outside 1..max_len={max_len} (e.g. index {bad[0]} has length "
            f"{values[bad[0]]}); truncate long examples before packing"
        )
    return values
