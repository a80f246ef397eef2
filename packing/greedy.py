"""SPFHP and LPFHP: greedy histogram packing, longest sequences first, on counts.

Both place the lengths from the longest to the shortest. SPFHP (shortest-pack-first) puts each
sequence into the open pack with the *most* room that still fits (worst fit), LPFHP
(longest-pack-first) into the one with the *least* room that still fits (best fit). A new pack is
opened when nothing fits.

Open packs are kept as groups ``room -> {contents: count}`` and a sorted list of the rooms in use,
so a whole group of identical packs moves at once and is split only when fewer sequences than packs
are left. The result equals placing the sequences one by one (ties between packs of equal room go to
the pack with fewer, then lexicographically smaller, contents), at a cost that depends on the number
of distinct lengths and pack groups, never on the number of sequences.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable

import numpy as np

Contents = tuple[int, ...]


def tie_key(contents: Contents) -> tuple[int, Contents]:
    """Order among open packs of equal room: fewer sequences first, then smaller contents."""
    return (len(contents), contents)


class _OpenPacks:
    """Groups of identical open packs indexed by remaining room."""

    def __init__(self, max_len: int, depth_cap: int):
        self.max_len = max_len
        self.depth_cap = depth_cap
        self.by_room: dict[int, dict[Contents, int]] = {}
        self.rooms: list[int] = []  # sorted rooms with at least one open pack
        self.closed: collections.Counter = collections.Counter()
        self.min_length = 1  # no open pack with less room than this can ever be filled again

    def add(self, contents: Contents, count: int) -> None:
        if count <= 0:
            return
        room = self.max_len - sum(contents)
        if room < self.min_length or len(contents) >= self.depth_cap:
            self.closed[contents] += count
            return
        group = self.by_room.get(room)
        if group is None:
            group = self.by_room[room] = {}
            bisect.insort(self.rooms, room)
        group[contents] = group.get(contents, 0) + count

    def take(self, room: int) -> tuple[Contents, int]:
        """Removes and returns the preferred group of packs with this room."""
        group = self.by_room[room]
        contents = min(group, key=tie_key)
        count = group.pop(contents)
        if not group:
            del self.by_room[room]
            del self.rooms[bisect.bisect_left(self.rooms, room)]
        return contents, count

    def result(self) -> collections.Counter:
        packs = collections.Counter(self.closed)
        for group in self.by_room.values():
            for contents, count in group.items():
                packs[contents] += count
        return packs


def greedy_pack(
    hist: np.ndarray,
    max_len: int,
    max_depth: int,
    fit: str,
    open_packs: Iterable[tuple[Contents, int]] = (),
) -> collections.Counter:
    """Packs a validated histogram; returns ``Counter(contents tuple -> number of packs)``.

    Args:
      hist: int64 counts of shape ``[max_len + 1]``.
      max_len: tokens per pack.
      max_depth: most sequences per pack, 0 = unlimited.
      fit: "worst" (SPFHP: most room first) or "best" (LPFHP: least room that fits).
      open_packs: partly filled packs to continue filling, as (contents, count); used to repair the
        rounded solutions of the optimizing packers.
    """
    if fit not in ("worst", "best"):
        raise ValueError(f"fit must be 'worst' or 'best', got {fit!r}")
    depth_cap = max_depth if max_depth else max_len
    state = _OpenPacks(max_len, depth_cap)
    present = np.flatnonzero(hist)
    state.min_length = int(present[0]) if present.size else max_len + 1
    for contents, count in open_packs:
        state.add(tuple(contents), int(count))
    for length in present[::-1].tolist():
        remaining = int(hist[length])
        while remaining:
            rooms = state.rooms
            if fit == "worst":
                room = rooms[-1] if rooms and rooms[-1] >= length else None
            else:
                i = bisect.bisect_left(rooms, length)
                room = rooms[i] if i < len(rooms) else None
            if room is None:  # nothing fits: open packs, each filled as far as room and depth allow
                per_pack = min(max_len // length, depth_cap)
                full, rest = divmod(remaining, per_pack)
                state.add((length,) * per_pack, full)
                state.add((length,) * rest, 1 if rest else 0)
                break
            contents, count = state.take(room)
            if fit == "worst":  # one per pack: then these packs have less room than the rest
                used = min(count, remaining)
                state.add((*contents, length), used)
                remaining -= used
            else:  # best fit fills a pack with as many copies as fit, then moves on
                per_pack = min(room // length, depth_cap - len(contents))
                used = min(count, remaining // per_pack)
                state.add((*contents,) + (length,) * per_pack, used)
                remaining -= used * per_pack
                if used < count and remaining:
                    state.add((*contents,) + (length,) * remaining, 1)
                    used += 1
                    remaining = 0
            state.add(contents, count - used)
    return state.result()
