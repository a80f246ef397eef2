"""Histograms: construction, file round trips and clear errors for bad input."""

import numpy as np
import pytest

import packing
from packing import histogram, synthetic


def test_from_lengths_counts_each_length():
    hist = histogram.from_lengths([3, 1, 3, 5], max_len=6)
    np.testing.assert_array_equal(hist, [0, 1, 0, 2, 0, 1, 0])
    assert hist.dtype == np.int64


@pytest.mark.parametrize("suffix", [".txt", ".npy"])
def test_save_load_round_trip(tmp_path, suffix):
    hist = histogram.from_lengths([1, 2, 2, 7, 7, 7], max_len=8)
    path = tmp_path / f"hist{suffix}"
    packing.save_histogram(hist, path)
    np.testing.assert_array_equal(packing.load_histogram(path, max_len=8), hist)
    # Without max_len, trailing zeros are dropped.
    np.testing.assert_array_equal(packing.load_histogram(path), hist[:8])


def test_text_format_is_one_count_per_line(tmp_path):
    path = tmp_path / "h.txt"
    packing.save_histogram([0, 4, 0, 2], path)
    assert path.read_text() == "0\n4\n0\n2\n"


def test_validate_pads_to_max_len():
    out = histogram.validate_histogram([0, 1, 2], max_len=5)
    np.testing.assert_array_equal(out, [0, 1, 2, 0, 0, 0])


@pytest.mark.parametrize(
    ("hist", "max_len", "message"),
    [
        ([0, -1, 2], None, "must be >= 0"),
        ([0, 1.5, 2], None, "whole numbers"),
        ([0, np.nan], None, "whole numbers"),
        (["a", "b"], None, "must be integers"),
        ([0, 0, 0], None, "empty"),
        ([], None, "empty"),
        ([3, 1, 1], None, "histogram\\[0\\]"),
        ([0, 1, 0, 0, 2], 3, "longer than max_len=3"),
        ([[0, 1]], None, "1-D"),
        ([0, 1], 0, "max_len must be an integer >= 1"),
        ([0, 1], 2.5, "max_len must be an integer >= 1"),
        (np.array([False, True]), None, "must be integers"),
    ],
)
def test_validate_rejects_bad_histograms(hist, max_len, message):
    with pytest.raises(ValueError, match=message):
        histogram.validate_histogram(hist, max_len)


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([1, 9], "longer than max_len=8"),
        ([0, 2], ">= 1"),
        ([], "no sequence"),
        ([1.5], "integer"),
        (["3"], "integer"),
    ],
)
def test_from_lengths_rejects_bad_lengths(lengths, message):
    with pytest.raises(ValueError, match=message):
        histogram.from_lengths(np.asarray(lengths), max_len=8)
    with pytest.raises(ValueError, match=message):
        histogram.from_lengths(iter(lengths), max_len=8)


def test_load_reports_the_bad_line(tmp_path):
    path = tmp_path / "h.txt"
    path.write_text("0\n3\nseven\n")
    with pytest.raises(ValueError, match=r"h.txt:3: expected one integer"):
        histogram.load_histogram(path)


def test_checksum_ignores_trailing_zeros_and_sees_counts():
    a = histogram.histogram_checksum([0, 1, 2])
    assert a == histogram.histogram_checksum([0, 1, 2, 0, 0])
    assert a != histogram.histogram_checksum([0, 2, 1])


def test_squad_reference_totals(squad_histogram):
    assert squad_histogram.sum() == 88_641
    assert histogram.total_tokens(squad_histogram) == 15_249_479


def test_wikipedia_like_shape_and_determinism():
    hist = synthetic.wikipedia_like_histogram(1_000_000, 512, seed=1)
    assert hist.shape == (513,) and hist.sum() == 1_000_000 and hist[0] == 0
    assert 0.47 < hist[:256].sum() / 1e6 < 0.53
    assert 0.23 < hist[512] / 1e6 < 0.27
    np.testing.assert_array_equal(hist, synthetic.wikipedia_like_histogram(1_000_000, 512, 1))
    assert not np.array_equal(hist, synthetic.wikipedia_like_histogram(1_000_000, 512, 2))
    huge = synthetic.wikipedia_like_histogram(10**9, 512)
    assert huge.sum() == 10**9


def test_corpus_like_histogram_has_the_figures_of_real_bert_data():
    """A real 16.3M-sequence Wikipedia histogram at 512: 23% at the row length, 37% at 128 or
    less, neighbouring counts within about 1% (median |log count(l + 1) - log count(l)|)."""
    hist = synthetic.corpus_like_histogram(16_300_000, 512, seed=0)
    assert hist.shape == (513,) and hist.sum() == 16_300_000 and hist[:2].sum() == 0
    assert np.all(hist[2:] > 0)  # dense: every length occurs
    assert hist[512] / hist.sum() == pytest.approx(0.23, abs=0.005)
    assert hist[: 128 + 1].sum() / hist.sum() == pytest.approx(0.37, abs=0.005)
    assert np.median(np.abs(np.diff(np.log(hist[2:512])))) < 0.015  # smooth
    shares = synthetic.corpus_like_histogram(1_000_000, 256, at_max_len=0.1, short_share=0.5)
    assert shares[256] / 1e6 == pytest.approx(0.1, abs=0.005)
    assert shares[:65].sum() / 1e6 == pytest.approx(0.5, abs=0.005)
    np.testing.assert_array_equal(hist, synthetic.corpus_like_histogram(16_300_000, 512, 0))
    assert not np.array_equal(hist, synthetic.corpus_like_histogram(16_300_000, 512, 1))
    jagged = synthetic.corpus_like_histogram(16_300_000, 512, seed=0, roughness=0.35)
    assert np.median(np.abs(np.diff(np.log(jagged[2:512])))) > 0.2
    for bad in (dict(at_max_len=1.0), dict(short_share=0.8), dict(short_share=0.0)):
        with pytest.raises(ValueError, match="short_share"):
            synthetic.corpus_like_histogram(100, 64, **bad)
