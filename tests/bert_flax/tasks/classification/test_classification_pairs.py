"""The offline sentence-pair set: every label is the rule's over the two texts, both labels occur,
and the files are what the classification task reads."""

from __future__ import annotations

import re

import numpy as np

from bert_flax.data import corpus
from bert_flax.tasks.classification import pairs, reading

SPEECH = corpus.Document(
    "speech.txt",
    (
        "We met in 1812 with the people of New York. Trade with New York grew by 40 percent.",
        "Peace holds. The year 1812 is long gone.",
        "Our army has 2,000 men. Nothing else happened here.",
    ),
)
# What counts as a mention, written out independently of `cloze`: two or more capitalised
# words, a year, or a number of two or more digits.
MENTION = re.compile(r"\b(?:[A-Z][a-z]+(?: [A-Z][a-z]+)+|1[6-9]\d\d|20\d\d|[\d,]{2,})\b")


def test_labels_follow_the_rule_and_both_occur():
    found = list(pairs.pairs(SPEECH, np.random.default_rng(0)))
    assert {label for _, _, label in found} == {"shared", "distinct"}
    for a, b, label in found:
        common = set(MENTION.findall(a)) & set(MENTION.findall(b))
        assert (label == "shared") == bool(common), (a, b, label)
        assert a != b


def test_written_files_read_as_sentence_pairs(tmp_path):
    counts = pairs.write_sets(str(tmp_path))
    assert min(counts.values()) > 100
    data = reading.read_labelled_files(
        str(tmp_path / "train.tsv"), str(tmp_path / "dev.tsv"), str(tmp_path / "test.tsv")
    )
    assert data.label_names == list(pairs.LABELS)
    assert all(len(data.splits[k]) == counts[n] for k, n in (("train", "train"), ("test", "test")))
    assert data.splits["train"].texts_b is not None
