"""Online packing for streams: sequences arrive one at a time, packs leave with a bounded buffer."""

from __future__ import annotations

import bisect

import numpy as np


class OnlinePacker:
    """Best-fit packing over at most ``buffer_size`` open packs.

    Each sequence goes into the open pack with the least room that still holds it (or a new one). A
    pack is emitted as soon as it is full (no room left or ``max_depth`` sequences); when more than
    ``buffer_size`` packs are open, the fullest one is emitted. Memory: ``O(buffer_size * depth)``.

    Example::

      packer = OnlinePacker(max_len=512, max_depth=3, buffer_size=64)
      for i, n in enumerate(lengths):
        for pack in packer.add(i, n):
          ...  # a list of indices
      for pack in packer.flush():
        ...
    """

    def __init__(self, max_len: int, max_depth: int = 3, buffer_size: int = 64):
        max_len = _check_int("max_len", max_len, 1)
        max_depth = _check_int("max_depth", max_depth, 0, "(0 = unlimited)")
        buffer_size = _check_int("buffer_size", buffer_size, 1)
        self.max_len = max_len
        self.max_depth = max_depth or max_len
        self.buffer_size = buffer_size
        self._open: dict[int, list[int]] = {}  # pack id -> indices
        self._rooms: list[tuple[int, int]] = []  # sorted (room, pack id) of the open packs
        self._next_id = 0
        self.packs_emitted = 0
        self.tokens_emitted = 0
        self._tokens_open: dict[int, int] = {}

    @property
    def efficiency(self) -> float:
        """Percent of real tokens in the packs emitted so far (0 before the first pack)."""
        if not self.packs_emitted:
            return 0.0
        return 100.0 * self.tokens_emitted / (self.packs_emitted * self.max_len)

    @property
    def num_open(self) -> int:
        return len(self._open)

    def add(self, index: int, length: int) -> list[list[int]]:
        """Adds one sequence; returns the packs completed by this call (often none)."""
        if (
            isinstance(length, bool)
            or not 1 <= int(length) <= self.max_len
            or length != int(length)
        ):
            raise ValueError(f"length must be an integer in 1..{self.max_len}, got {length!r}")
        length = int(length)
        i = bisect.bisect_left(self._rooms, (length, -1))
        if i < len(self._rooms):
            room, pack_id = self._rooms.pop(i)
        else:
            room, pack_id = self.max_len, self._next_id
            self._next_id += 1
            self._open[pack_id] = []
            self._tokens_open[pack_id] = 0
        self._open[pack_id].append(index)
        self._tokens_open[pack_id] += length
        room -= length
        emitted = []
        if room == 0 or len(self._open[pack_id]) >= self.max_depth:
            emitted.append(self._emit(pack_id))
        else:
            bisect.insort(self._rooms, (room, pack_id))
        while len(self._open) > self.buffer_size:
            _, fullest = self._rooms.pop(0)
            emitted.append(self._emit(fullest))
        return emitted

    def flush(self) -> list[list[int]]:
        """Emits every open pack (in the order they were opened)."""
        self._rooms.clear()
        return [self._emit(pack_id) for pack_id in sorted(self._open)]

    def _emit(self, pack_id: int) -> list[int]:
        self.packs_emitted += 1
        self.tokens_emitted += self._tokens_open.pop(pack_id)
        return self._open.pop(pack_id)


def _check_int(name: str, value, minimum: int, note: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(
            f"{name} must be an integer >= {minimum}{' ' + note if note else ''}, got {value!r}"
        )
    return int(value)
