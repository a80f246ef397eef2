"""Strategy sets: the result of packing a histogram; metrics, JSON I/O and an invariant check."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from packing import histogram as histogram_lib

Strategy = tuple[tuple[int, ...], int]
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class PackingMetrics:
    """Summary figures of a strategy set (efficiency in percent)."""

    sequences: int
    packs: int
    real_tokens: int
    padding_tokens: int
    efficiency: float
    packing_factor: float
    max_packing_factor: float
    mean_depth: float
    max_depth_used: int
    solve_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class StrategySet:
    """Packs described by counts: ``strategies`` is a list of (sorted length tuple, repeat count).

    Attributes:
      strategies: each entry says "make ``count`` packs holding sequences of exactly these lengths".
        Normalized on construction: tuples sorted ascending, duplicates merged, zero counts removed.
      max_len: tokens per pack (row length).
      max_depth: most sequences per pack the solver was allowed, 0 = unlimited.
      algorithm: name of the algorithm that produced the set.
      histogram_checksum: :func:`packing.histogram.histogram_checksum` of the packed histogram.
      solve_seconds: wall time of the solver.
      info: extra solver facts (for example ``lower_bound`` in packs), JSON-serializable.
    """

    strategies: list[Strategy]
    max_len: int
    max_depth: int
    algorithm: str
    histogram_checksum: str
    solve_seconds: float = 0.0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        merged: collections.Counter = collections.Counter()
        for lengths, count in self.strategies:
            count = int(count)
            if count < 0:
                raise ValueError(f"strategy {tuple(lengths)} has a negative count {count}")
            if count:
                merged[tuple(sorted(int(x) for x in lengths))] += count
        self.strategies = sorted(merged.items(), key=lambda item: (len(item[0]), item[0]))
        self.max_len = int(self.max_len)
        self.max_depth = int(self.max_depth or 0)

    @classmethod
    def from_counter(cls, packs: Mapping[tuple[int, ...], int], **kwargs) -> StrategySet:
        return cls(strategies=list(packs.items()), **kwargs)

    def histogram(self) -> np.ndarray:
        """The histogram these strategies consume, shape ``[max_len + 1]``."""
        counts = np.zeros(self.max_len + 1, np.int64)
        for lengths, count in self.strategies:
            for length in lengths:
                if not 1 <= length <= self.max_len:
                    raise ValueError(
                        f"strategy {lengths} holds length {length} outside 1..{self.max_len}"
                    )
                counts[length] += count
        return counts

    @property
    def num_packs(self) -> int:
        return sum(count for _, count in self.strategies)

    def metrics(self) -> PackingMetrics:
        sequences = sum(len(lengths) * count for lengths, count in self.strategies)
        tokens = sum(sum(lengths) * count for lengths, count in self.strategies)
        packs = self.num_packs
        capacity = packs * self.max_len
        min_packs = math.ceil(tokens / self.max_len) if tokens else 0
        return PackingMetrics(
            sequences=sequences,
            packs=packs,
            real_tokens=tokens,
            padding_tokens=capacity - tokens,
            efficiency=100.0 * tokens / capacity if capacity else 0.0,
            packing_factor=sequences / packs if packs else 0.0,
            max_packing_factor=sequences / min_packs if min_packs else 0.0,
            mean_depth=sequences / packs if packs else 0.0,
            max_depth_used=max((len(lengths) for lengths, _ in self.strategies), default=0),
            solve_seconds=float(self.solve_seconds),
        )

    def check(self, hist) -> None:
        """Raises ``ValueError`` unless the strategies pack exactly ``hist`` within the limits."""
        for lengths, _ in self.strategies:
            if sum(lengths) > self.max_len:
                raise ValueError(
                    f"strategy {lengths} holds {sum(lengths)} > max_len={self.max_len} tokens"
                )
            if self.max_depth and len(lengths) > self.max_depth:
                raise ValueError(
                    f"strategy {lengths} holds {len(lengths)} > max_depth={self.max_depth}"
                )
        expected = histogram_lib.validate_histogram(hist, self.max_len)
        consumed = self.histogram()
        if not np.array_equal(consumed, expected):
            diff = np.flatnonzero(consumed != expected)
            k = int(diff[0])
            raise ValueError(
                f"strategies consume {consumed[k]} sequences of length {k} but the histogram has "
                f"{expected[k]} ({diff.size} lengths differ)"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "algorithm": self.algorithm,
            "max_len": self.max_len,
            "max_depth": self.max_depth,
            "histogram_checksum": self.histogram_checksum,
            "solve_seconds": self.solve_seconds,
            "info": self.info,
            "metrics": self.metrics().as_dict(),
            "strategies": [[list(lengths), count] for lengths, count in self.strategies],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StrategySet:
        missing = {"algorithm", "max_len", "max_depth", "strategies"} - set(data)
        if missing:
            raise ValueError(f"not a strategy set: missing keys {sorted(missing)}")
        return cls(
            strategies=[(tuple(lengths), count) for lengths, count in data["strategies"]],
            max_len=data["max_len"],
            max_depth=data["max_depth"],
            algorithm=data["algorithm"],
            histogram_checksum=data.get("histogram_checksum", ""),
            solve_seconds=data.get("solve_seconds", 0.0),
            info=dict(data.get("info", {})),
        )

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> StrategySet:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))


def counter_of(strategies: Iterable[Strategy]) -> collections.Counter:
    """Merges (lengths, count) pairs into a Counter keyed by sorted length tuples."""
    merged: collections.Counter = collections.Counter()
    for lengths, count in strategies:
        if count:
            merged[tuple(sorted(lengths))] += int(count)
    return merged
