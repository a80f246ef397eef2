"""Synthetic length histograms for benchmarks and tests."""

from __future__ import annotations

import numpy as np
import scipy.optimize


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
    at_max_len: float = 0.23,
    short_share: float = 0.37,
    roughness: float = 0.0,
) -> np.ndarray:
    """A histogram with the figures of a real BERT pre-training corpus at ``max_len``.

    A real 16.3M-sequence Wikipedia histogram at 512 has about 23% of its sequences at exactly
    ``max_len`` (documents cut at the row length), 37% at ``max_len / 4`` or less (document ends,
    short paragraphs, BERT's 10% short targets), and smooth counts (median
    ``|log count(l + 1) - log count(l)|`` about 0.01). Here every length from 2 to ``max_len - 1``
    occurs with density ``length^-p``, the power ``p`` solved so that ``short_share`` of all
    sequences are at most ``max_len // 4`` long, and ``at_max_len`` are exactly ``max_len``.
    ``roughness > 0`` jags each bin's density by a log-normal factor of that spread (a harder,
    unrealistic case for solvers). Multinomial counts: they sum to ``num_sequences`` and depend
    only on the arguments.

    Returns:
      int64 array of shape ``[max_len + 1]`` (index = length).
    """
    _check_size(num_sequences, max_len)
    if not (0.0 <= at_max_len < 1.0 and 0.0 < short_share < 1.0 - at_max_len):
        raise ValueError(
            f"need 0 <= at_max_len < 1 and 0 < short_share < 1 - at_max_len, got at_max_len="
            f"{at_max_len}, short_share={short_share}"
        )
    rng = np.random.default_rng(seed)
    lengths = np.arange(2, max_len, dtype=np.float64)
    is_short = lengths <= max_len // 4
    share_of_body = short_share / (1.0 - at_max_len)

    def short_excess(power: float) -> float:
        density = lengths**-power
        return density[is_short].sum() / density.sum() - share_of_body

    # The short share grows monotonically with the power; the bracket spans a rising density to
    # one concentrated on the shortest lengths.
    power = scipy.optimize.brentq(short_excess, -3.0, 10.0)
    body = lengths**-power * np.exp(rng.normal(0.0, roughness, lengths.size))
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
