"""From an integer number of pattern copies to packs of real sequences, and the repair step.

Optimizing packers (NNLSHP, LP) return how many copies of each exact-fill pattern to make. The
sequences are then matched to pattern slots on counts: from the longest length down, each sequence
takes the smallest free slot that holds it (a longer slot is padded). Sequences left without a slot
are the residual; the repair packs them greedily, first into the room left in the realized packs,
then into new packs, so every sequence is packed. Slots nobody uses become padding.
"""

from __future__ import annotations

import bisect
import collections

import numpy as np

from packing import greedy

# A group of identical packs in the making: (sequence lengths placed, free slot lengths).
_Group = tuple[tuple[int, ...], tuple[int, ...]]


def realize(
    patterns, copies: np.ndarray, hist: np.ndarray, max_len: int
) -> tuple[collections.Counter, np.ndarray]:
    """Matches the histogram to ``copies[j]`` copies of pattern ``patterns[j]``.

    ``patterns`` is a zero-padded array of slot lengths per row, or a list of length tuples.

    Returns:
      (packs, residual): packs as ``Counter(sorted contents -> count)`` (empty slots dropped; packs
      with no sequence at all are not made) and the histogram of sequences that found no slot.
    """
    groups: dict[_Group, int] = {}
    by_slot: dict[int, set[_Group]] = collections.defaultdict(set)
    slots: list[int] = []  # sorted free-slot lengths in use

    def add(group: _Group, count: int) -> None:
        if count <= 0:
            return
        if group in groups:
            groups[group] += count
            return
        groups[group] = count
        for slot in set(group[1]):
            if not by_slot[slot]:
                bisect.insort(slots, slot)
            by_slot[slot].add(group)

    def remove(group: _Group, count: int) -> None:
        groups[group] -= count
        if groups[group]:
            return
        del groups[group]
        for slot in set(group[1]):
            members = by_slot[slot]
            members.discard(group)
            if not members:
                del slots[bisect.bisect_left(slots, slot)]

    for row, count in zip(patterns, copies):
        if count > 0:
            free = tuple(sorted(int(x) for x in row if x > 0))
            add(((), free), int(count))

    residual = np.zeros_like(hist)
    for length in np.flatnonzero(hist)[::-1].tolist():
        remaining = int(hist[length])
        while remaining:
            i = bisect.bisect_left(slots, length)
            if i == len(slots):
                residual[length] = remaining
                break
            slot = slots[i]
            group = min(by_slot[slot])
            used = min(groups[group], remaining)
            placed, free = group
            k = free.index(slot)
            remove(group, used)
            add((tuple(sorted((*placed, length))), free[:k] + free[k + 1 :]), used)
            remaining -= used

    packs: collections.Counter = collections.Counter()
    for (placed, _), count in groups.items():
        if placed:
            packs[placed] += count
    return packs, residual


def repair(
    packs: collections.Counter, residual: np.ndarray, max_len: int, max_depth: int
) -> collections.Counter:
    """Packs the residual sequences into the room left in ``packs`` and then into new packs.

    Tries worst fit (SPFHP) and best fit (LPFHP) and keeps the one with fewer packs.
    """
    if not residual.any():
        return packs
    best = None
    for fit in ("best", "worst"):
        result = greedy.greedy_pack(residual, max_len, max_depth, fit, open_packs=packs.items())
        if best is None or sum(result.values()) < sum(best.values()):
            best = result
    return best


def round_and_repair(
    patterns, x: np.ndarray, hist: np.ndarray, max_len: int, max_depth: int
) -> tuple[collections.Counter, str]:
    """Rounds fractional copies down and to nearest, realizes and repairs both; keeps the better."""
    best = None
    for name, copies in (("floor", np.floor(x + 1e-6)), ("nearest", np.rint(x))):
        packs, residual = realize(patterns, copies.astype(np.int64), hist, max_len)
        packs = repair(packs, residual, max_len, max_depth)
        if best is None or sum(packs.values()) < sum(best[0].values()):
            best = (packs, name)
    return best
