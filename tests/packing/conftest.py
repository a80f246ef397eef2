"""Shared fixtures for the packing tests."""

import pathlib

import numpy as np
import pytest
from hypothesis import strategies as st

SQUAD = pathlib.Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "histograms"
SQUAD = SQUAD / "squad_1_1_384.txt"


@pytest.fixture(scope="session")
def squad_histogram():
    """The SQuAD 1.1 length histogram at max_len 384 (skips if ../shared/data is absent)."""
    if not SQUAD.exists():
        pytest.skip(f"reference histogram {SQUAD} is not available")
    from packing import histogram

    return histogram.load_histogram(SQUAD, 384)


@st.composite
def histograms(draw, max_len_range=(1, 40), max_sequences=60):
    """(histogram, max_len) with a few random lengths and counts, at least one sequence."""
    max_len = draw(st.integers(*max_len_range))
    lengths = draw(
        st.lists(st.integers(1, max_len), min_size=1, max_size=min(12, max_len), unique=True)
    )
    hist = np.zeros(max_len + 1, np.int64)
    for length in lengths:
        hist[length] = draw(st.integers(1, max_sequences // len(lengths) + 1))
    return hist, max_len


@pytest.fixture(scope="session")
def histogram_strategy():
    return histograms
