"""The bundled long-context histograms are what the pre-training recipe makes of their corpora:
the command that wrote them writes the same bytes again (the speeches at 1,024), and each file
is the corpus's examples at its length (none longer, some cut at the row)."""

from __future__ import annotations

import filecmp
import subprocess
import sys

import numpy as np
import pytest

import packing
from packing import histogram
from tests.paths import ROOT


def test_the_command_rewrites_the_bundled_speeches_histogram_at_1024(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "bert_flax.data.document_histograms", f"--output_dir={tmp_path}",
         "--corpora=sotu", "--lengths=1024"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert filecmp.cmp(tmp_path / "sotu_1024.txt", histogram.DATA_DIR / "sotu_1024.txt", False)


@pytest.mark.parametrize("corpus", histogram.LONG_CONTEXT_CORPORA)
def test_every_length_holds_the_corpus_cut_at_its_rows(corpus):
    tokens = []
    for max_len in histogram.LONG_CONTEXT_LENGTHS:
        hist = packing.histogram.long_context_histogram(corpus, max_len)
        assert hist.shape == (max_len + 1,) and hist[max_len] > 0
        tokens.append(histogram.total_tokens(hist))
    # The same documents at every length: the tokens differ by the [CLS]/[SEP] of each cut and
    # the random next sentences only.
    assert max(tokens) / min(tokens) < 1.2, tokens
    assert np.all(np.diff([hist_count(corpus, n) for n in histogram.LONG_CONTEXT_LENGTHS]) < 0)


def hist_count(corpus: str, max_len: int) -> int:
    return int(histogram.long_context_histogram(corpus, max_len).sum())


def test_an_unbundled_length_names_the_bundled_ones():
    with pytest.raises(ValueError, match="lengths"):
        histogram.long_context_histogram("sotu", 512)
