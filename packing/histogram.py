"""Sequence-length histograms: ``hist[k]`` is the number of sequences of length ``k``.

A histogram for rows of ``max_len`` tokens is an ``int64`` array of shape ``[max_len + 1]`` whose
entry 0 is 0 (there are no empty sequences). On disk it is either a ``.npy`` file or plain text with
one count per line, line ``k`` (counting from 0) holding the count of length ``k``.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Iterable

import numpy as np

PathLike = str | os.PathLike

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"  # shipped with the package
SQUAD_1_1_384 = DATA_DIR / "squad_1_1_384.txt"  # provenance and licence: data/README.md
# Pre-training example lengths at long rows (bert_flax/data/document_histograms.py; data/README.md).
LONG_CONTEXT_CORPORA = ("sotu", "lognormal_web")
LONG_CONTEXT_LENGTHS = (1024, 2048, 4096, 8192)


def validate_histogram(hist, max_len: int | None = None) -> np.ndarray:
    """Checks a histogram; returns it as ``int64`` (shape ``[max_len + 1]`` if ``max_len`` given).

    Trailing zero counts beyond ``max_len`` are dropped; a shorter histogram is padded with zeros.

    Raises:
      ValueError: naming what is wrong (not 1-D, negative or non-integer counts, a count at
        length 0, sequences longer than ``max_len``, no sequences at all, ``max_len < 1``).
    """
    if max_len is not None:
        max_len = _check_max_len(max_len)
    array = np.asarray(hist)
    if array.ndim != 1:
        raise ValueError(f"histogram must be 1-D (index = length), got shape {array.shape}")
    if array.dtype == bool or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise ValueError(f"histogram counts must be integers, got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(array) | (array != np.round(array)))
        if bad.size:
            raise ValueError(
                f"histogram counts must be whole numbers; length {bad[0]} has count "
                f"{array[bad[0]]!r}"
            )
    negative = np.flatnonzero(array < 0)
    if negative.size:
        raise ValueError(
            f"histogram counts must be >= 0; length {negative[0]} has count {array[negative[0]]}"
        )
    counts = array.astype(np.int64)
    if counts.size and counts[0] != 0:
        raise ValueError(
            f"histogram[0] (sequences of length 0) must be 0, got {counts[0]}: line/index k counts "
            "sequences of length k, so a file for max_len L has L + 1 lines starting with 0"
        )
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        raise ValueError("histogram is empty: it holds no sequences")
    if max_len is None:
        return counts[: nonzero[-1] + 1]
    if nonzero[-1] > max_len:
        too_long = int(counts[max_len + 1 :].sum())
        raise ValueError(
            f"{too_long} sequences are longer than max_len={max_len} (the longest has length "
            f"{nonzero[-1]}); truncate them before building the histogram or raise max_len"
        )
    out = np.zeros(max_len + 1, np.int64)
    size = min(counts.size, max_len + 1)
    out[:size] = counts[:size]
    return out


def from_lengths(lengths: Iterable[int], max_len: int) -> np.ndarray:
    """Histogram of shape ``[max_len + 1]`` counting the given sequence lengths."""
    max_len = _check_max_len(max_len)
    values = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths))
    if values.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {values.shape}")
    if values.size and not np.issubdtype(values.dtype, np.integer):
        if not np.issubdtype(values.dtype, np.floating) or np.any(values != np.round(values)):
            raise ValueError(f"sequence lengths must be integers, got dtype {values.dtype}")
        values = values.astype(np.int64)
    if values.size == 0:
        raise ValueError("no sequence lengths given: the histogram would be empty")
    if values.min() < 1:
        raise ValueError(f"sequence lengths must be >= 1, got {values.min()}")
    if values.max() > max_len:
        raise ValueError(
            f"{int((values > max_len).sum())} sequences are longer than max_len={max_len} "
            f"(longest {values.max()}); truncate them first or raise max_len"
        )
    return np.bincount(values, minlength=max_len + 1).astype(np.int64)


def load_histogram(path: PathLike, max_len: int | None = None) -> np.ndarray:
    """Reads a ``.npy`` or text histogram (one count per line) and validates it."""
    path = os.fspath(path)
    if path.endswith(".npy"):
        return validate_histogram(np.load(path), max_len)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 ({e.reason}); one integer count per line.") from None
    counts = []
    for line_number, line in enumerate(lines):
        text = line.strip()
        if not text:
            continue
        try:
            counts.append(int(text))
        except ValueError:
            raise ValueError(
                f"{path}:{line_number + 1}: expected one integer count per line, got {text!r}"
            ) from None
    try:
        return validate_histogram(np.asarray(counts, np.int64), max_len)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def squad_1_1_histogram() -> np.ndarray:
    """SQuAD 1.1's sequence-length histogram at max_len 384 (88,641 sequences), from the paper."""
    return load_histogram(SQUAD_1_1_384, 384)


def long_context_histogram(corpus: str, max_len: int) -> np.ndarray:
    """The bundled pre-training length histogram of ``corpus`` (LONG_CONTEXT_CORPORA) at
    ``max_len`` (LONG_CONTEXT_LENGTHS)."""
    if corpus not in LONG_CONTEXT_CORPORA or max_len not in LONG_CONTEXT_LENGTHS:
        raise ValueError(
            f"no bundled histogram {corpus!r} at {max_len}: corpora {LONG_CONTEXT_CORPORA}, "
            f"lengths {LONG_CONTEXT_LENGTHS}"
        )
    return load_histogram(DATA_DIR / f"{corpus}_{max_len}.txt", max_len)


def save_histogram(hist, path: PathLike) -> None:
    """Writes a histogram as ``.npy`` or as text (one count per line, line 0 = length 0)."""
    counts = validate_histogram(hist)
    path = os.fspath(path)
    if path.endswith(".npy"):
        np.save(path, counts)
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"{c}\n" for c in counts.tolist()))


def histogram_checksum(hist) -> str:
    """A short stable digest of the counts (trailing zeros ignored), stored with strategy sets."""
    counts = validate_histogram(hist)
    return hashlib.sha256(counts.astype("<i8").tobytes()).hexdigest()[:16]


def total_tokens(hist) -> int:
    """Number of real tokens, exact for any count (Python integers)."""
    counts = np.asarray(hist, np.int64)
    return int(sum(int(c) * k for k, c in enumerate(counts.tolist()) if c))


def _check_max_len(max_len) -> int:
    if isinstance(max_len, bool) or not isinstance(max_len, int | np.integer) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
    return int(max_len)
