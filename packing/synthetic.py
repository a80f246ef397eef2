"""Synthetic length histograms for benchmarks and tests."""

from __future__ import annotations

import numpy as np


def wikipedia_like_histogram(
    num_sequences: int = 16_000_000, max_len: int = 512, seed: int = 0
) -> np.ndarray:
    """A histogram shaped like BERT pre-training data from Wikipedia at ``max_len``.

    About a quarter of the sequences are exactly ``max_len`` long (documents cut at the row
    length), about half are shorter than ``max_len / 2`` (document ends and BERT's 10% short
    sequences, with a bump around 0.3 * max_len), and the rest spread over
    ``[max_len / 2, max_len)`` with a density falling towards ``max_len``. Lengths start at
    ``max(2, max_len // 64)``. Counts are drawn with a multinomial, so they sum to exactly
    ``num_sequences`` and depend only on the arguments.

    Returns:
      int64 array of shape ``[max_len + 1]`` (index = length).
    """
    _check_size(num_sequences, max_len)
    lengths = np.arange(max_len + 1, dtype=np.float64)
    shortest = max(2, max_len // 64)
    half = max_len // 2
    short = (lengths >= shortest) & (lengths < half)
    middle = (lengths >= half) & (lengths < max_len)
    bump = np.exp(-(((lengths - 0.3 * max_len) / (0.12 * max_len)) ** 2))
    probs = np.zeros(max_len + 1)
    probs[short] = 0.5 * _normalized(1.0 + 2.0 * bump[short])
    probs[middle] = 0.25 * _normalized(1.5 - (lengths[middle] - half) / max_len)
    probs[max_len] = 0.25
    rng = np.random.default_rng(seed)
    return rng.multinomial(int(num_sequences), probs / probs.sum()).astype(np.int64)


def corpus_like_histogram(
    num_sequences: int = 16_300_000,
    max_len: int = 512,
    seed: int = 0,
    *,
    at_max_len: float = 0.2,
    short_tail_power: float = 0.6,
    roughness: float = 0.35,
) -> np.ndarray:
    """A histogram with the structure of a real pre-training corpus at ``max_len``.

    Unlike the smooth ``wikipedia_like_histogram``, every length from 2 to ``max_len`` occurs
    (dense bins), short sequences form a heavy tail (density ~ length^-short_tail_power: document
    ends, short paragraphs), 30% of the rest form a broad hump around 0.4 * max_len, each bin's
    density is jagged by a log-normal factor (``roughness``) as real counts are, and
    ``at_max_len`` of the sequences are exactly ``max_len`` long (documents cut at the row
    length). Multinomial counts: they sum to ``num_sequences`` and depend only on the arguments.

    Returns:
      int64 array of shape ``[max_len + 1]`` (index = length).
    """
    _check_size(num_sequences, max_len)
    if not 0.0 <= at_max_len < 1.0:
        raise ValueError(f"at_max_len must be in [0, 1), got {at_max_len}")
    rng = np.random.default_rng(seed)
    lengths = np.arange(2, max_len, dtype=np.float64)
    tail = _normalized(lengths**-short_tail_power)
    hump = _normalized(np.exp(-(((lengths - 0.4 * max_len) / (0.25 * max_len)) ** 2)))
    body = (0.7 * tail + 0.3 * hump) * np.exp(rng.normal(0.0, roughness, lengths.size))
    probs = np.zeros(max_len + 1)
    probs[2:max_len] = (1.0 - at_max_len) * _normalized(body)
    probs[max_len] = at_max_len
    return rng.multinomial(int(num_sequences), probs / probs.sum()).astype(np.int64)


def _check_size(num_sequences: int, max_len: int) -> None:
    if max_len < 8:
        raise ValueError(f"max_len must be >= 8 for a corpus-shaped histogram, got {max_len}")
    if num_sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, got {num_sequences}")


def _normalized(values: np.ndarray) -> np.ndarray:
    return values / values.sum()
