"""Shared fixtures for the packing tests."""

import numpy as np
import pytest
from hypothesis import strategies as st

from packing import histogram


@pytest.fixture(scope="session")
def squad_histogram():
    """The SQuAD 1.1 length histogram at max_len 384, shipped in packing/data/."""
    return histogram.squad_1_1_histogram()


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
