r"""A sentence-pair set that installs offline: pairs of sentences from the bundled State of the
Union speeches, labelled by whether they mention a common name, year or number.

    python -m bert_flax.tasks.classification.pairs --out=workdir/pairs  # train/dev/test.tsv

Sentence a has at least one mention (`cloze.mentions`: a run of capitalised words, a year, a
number); sentence b is another sentence of the same speech, drawn so that half the pairs are
`shared` (b mentions one of a's names or numbers) and half `distinct` (b mentions none of them).
The label is a rule over both texts, so a model must compare the two segments (neither alone
says it). Whole speeches go to train, dev or test (`corpus.split_documents`). The files are TSV
with columns `text`, `text_b`, `label`: what `configs/finetune_sentiment.py` reads with
`--config.data.train_file=DIR/train.tsv --config.data.validation_file=DIR/dev.tsv
--config.data.test_file=DIR/test.tsv`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
from absl import app, flags

from bert_flax.data import corpus
from bert_flax.tasks.squad import cloze

LABELS = ("distinct", "shared")
HELD_OUT_FRACTION = 0.2  # of the speeches: half dev, half test


def _sentences(document: corpus.Document) -> list[tuple[str, frozenset[str]]]:
    """The speech's sentences (tabs and newlines flattened) with their mentions."""
    found = []
    for paragraph in document.paragraphs:
        for sentence in cloze.split_sentences(paragraph):
            text = " ".join(sentence.split())
            found.append((text, frozenset(m.group() for m in cloze.mentions(text))))
    return found


def pairs(document: corpus.Document, rng: np.random.Generator) -> Iterator[tuple[str, str, str]]:
    """(a, b, label) pairs of one speech: for every sentence with a mention, alternately a
    `shared` and a `distinct` partner (none where the speech has no partner of that kind)."""
    sentences = _sentences(document)
    for k, (a, named) in enumerate(sentences):
        if not named:
            continue
        shared = [b for j, (b, other) in enumerate(sentences) if j != k and named & other]
        distinct = [b for j, (b, other) in enumerate(sentences) if j != k and not named & other]
        label = LABELS[k % 2]
        choices = shared if label == "shared" else distinct
        if choices:
            yield a, choices[rng.integers(len(choices))], label


def build(documents: Sequence[corpus.Document], seed: int = 0) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    return [pair for document in documents for pair in pairs(document, rng)]


def write_sets(out: str, seed: int = 0) -> dict[str, int]:
    """train.tsv, dev.tsv and test.tsv under `out`; pairs per file."""
    documents = corpus.read_documents(corpus.bundled_corpus_dir())
    split = corpus.split_documents(documents, HELD_OUT_FRACTION)
    held_out = corpus.split_documents(split["validation"], 0.5)
    parts = {"train": split["train"], "dev": held_out["train"], "test": held_out["validation"]}
    os.makedirs(out, exist_ok=True)
    counts = {}
    for name, part in parts.items():
        rows = build(part, seed=seed)
        with open(os.path.join(out, f"{name}.tsv"), "w", encoding="utf-8") as f:
            f.write("text\ttext_b\tlabel\n")
            f.writelines(f"{a}\t{b}\t{label}\n" for a, b, label in rows)
        counts[name] = len(rows)
    return counts


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("out", None, "Folder for train.tsv, dev.tsv and test.tsv.", required=True)
    flags.DEFINE_integer("seed", 0, "Which partner each sentence gets.")


def main(argv: list[str]) -> None:
    del argv
    for name, count in write_sets(FLAGS.out, seed=FLAGS.seed).items():
        print(f"{os.path.join(FLAGS.out, name + '.tsv')}: {count:,} pairs")


if __name__ == "__main__":
    define_flags()
    app.run(main)
