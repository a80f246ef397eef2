"""The fine-tuning benchmark's sets pack at the factors its doc promises (about 2, 4.6 and 8),
keep every label, and are built as it says; no training here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert_flax.data import tokenization
from bert_flax.input_pipeline import rows
from bert_flax.tasks.classification import data as classification
from bert_flax.tasks.classification import reading as classification_reading


@pytest.fixture(scope="module")
def sets(tmp_path_factory, load_benchmark):
    bench = load_benchmark("studies.finetune_packed_vs_padded")
    directory = tmp_path_factory.mktemp("sets")
    out = {}
    for name in bench.SET_BUILDERS:
        with open(bench.write_set(name, str(directory)), encoding="utf-8") as f:
            out[name] = [json.loads(line) for line in f]
    return bench, out


def _packing_factor(records: list[dict], config) -> float:
    split = classification.LabelledSplit(
        texts=[r["text"] for r in records],
        texts_b=None,
        labels=np.array([r["label"] for r in records], np.int32),
        ids=np.arange(len(records), dtype=np.int32),
    )
    encoded = classification.encode_split(
        tokenization.load_vocab(None), split, config.data.max_seq_length
    )
    packs = rows.pack_examples(
        encoded.lengths,
        config.data.max_seq_length,
        config.data.max_sequences_per_pack,
        algorithm=config.data.algorithm,
    )
    return rows.packing_factor(packs)


def test_sets_pack_at_about_2_4_and_8(sets):
    bench, records = sets
    config = bench.layout_config("packed", "")
    factors = {name: _packing_factor(r, config) for name, r in records.items()}
    assert 1.6 < factors["pairs"] < 3.0, factors
    assert 3.5 < factors["bundled"] < 6.0, factors
    assert 6.5 < factors["first_words"] <= config.data.max_sequences_per_pack, factors


def test_sets_keep_labels_and_are_built_as_documented(sets):
    bench, records = sets
    reviews = classification_reading.rotten_tomatoes().splits
    total = sum(len(s) for s in reviews.values())
    assert len(records["bundled"]) == len(records["first_words"]) == total
    assert total // 2 - 1 <= len(records["pairs"]) <= total // 2
    assert max(len(r["text"].split()) for r in records["first_words"]) == bench.FIRST_WORDS
    texts = {r["text"]: r["label"] for r in records["bundled"]}
    first_pair = records["pairs"][0]
    joined = [t for t in texts if first_pair["text"].startswith(t + " ")]
    assert joined and texts[joined[0]] == first_pair["label"]  # a pair keeps its reviews' label
