"""CoNLL-2003 files and the TFDS `conll2003` builder, read into sentences of (word, label).

    sentences = read_conll("eng.train")            # the last column is the label
    sentences = read_conll("eng.train", label_column=1)  # POS tags (token POS chunk NER)
    sentences, names = read_tfds("conll2003", "train", "ner")

A CoNLL file has one word a line, the word then its columns separated by whitespace, a blank
line between sentences; `-DOCSTART-` lines are skipped. A file of one column is unlabelled (for
prediction). Labels are checked against the scheme (`metrics.SCHEMES`), and errors name the
file and line and say what to fix.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence

from bert_flax.tasks.token_classification import metrics

DOCSTART = "-DOCSTART-"


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence: its words, their labels (None if unlabelled) and where it comes from."""

    words: tuple[str, ...]
    labels: tuple[str, ...] | None
    source: str  # its file, or what else it comes from (a TFDS example)
    line: int = 0  # the file's line of its first word (0: not from a file)

    def at(self, word: int = 0) -> str:
        """Where word `word` is: "file:line", or the source and the word's number."""
        return (
            f"{self.source}:{self.line + word}" if self.line else f"{self.source}, word {word + 1}"
        )


def _blocks(path: str) -> Iterator[list[tuple[int, list[str]]]]:
    """The sentences of a CoNLL file as lists of (line number, columns)."""
    block: list[tuple[int, list[str]]] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            columns = line.split()
            if columns and columns[0] == DOCSTART:
                continue
            if columns:
                block.append((number, columns))
            elif block:
                yield block
                block = []
    if block:
        yield block


def _sentence(path: str, block: list[tuple[int, list[str]]], label_column: int) -> Sentence:
    first, columns = block[0]
    width = len(columns)
    for number, row in block:
        if len(row) != width:
            raise ValueError(
                f"{path}:{number}: {len(row)} columns, but the sentence starting at line "
                f"{first} has {width}; give every line of a sentence the same columns "
                "(a word holds no spaces)."
            )
    words = tuple(row[0] for _, row in block)
    if width == 1:
        return Sentence(words, None, path, first)
    if not (0 < label_column < width or -width < label_column < 0):
        raise ValueError(
            f"{path}:{first}: label_column={label_column} is not a label column of lines of "
            f"{width} columns (0 is the word); choose one of 1..{width - 1} or -1 for the last."
        )
    return Sentence(words, tuple(row[label_column] for _, row in block), path, first)


def read_conll(path: str, label_column: int = -1, scheme: str = "none") -> list[Sentence]:
    """The sentences of the CoNLL file `path`, labels from `label_column` (-1: the last column)
    checked as tags of `scheme`."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"CoNLL file {path!r} does not exist.")
    try:
        sentences = [_sentence(path, block, label_column) for block in _blocks(path)]
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text ({error.reason} at byte {error.start}); convert it, "
            f"e.g. iconv -f latin1 -t utf-8 {path}."
        ) from None
    if not sentences:
        raise ValueError(
            f"{path} holds no sentences: a CoNLL file has a word and its labels a line, a "
            "blank line between sentences."
        )
    unlabelled = [s.at() for s in sentences if s.labels is None]
    if unlabelled and len(unlabelled) < len(sentences):
        raise ValueError(
            f"{unlabelled[0]}: a sentence without labels in a labelled file; give it its label "
            "column, or remove the labels of every sentence."
        )
    check_labels(sentences, scheme)
    return sentences


def check_labels(sentences: Sequence[Sentence], scheme: str) -> None:
    """ValueError naming the first label that is not a tag of `scheme`."""
    metrics.check_scheme(scheme)
    for sentence in sentences:
        for offset, label in enumerate(sentence.labels or ()):
            error = metrics.tag_error(label, scheme)
            if error:
                raise ValueError(
                    f"{sentence.at(offset)}: {error}; set config.data.label_scheme to the "
                    "file's scheme, or 'none' for tags without entities (POS)."
                )


def unseen_labels(sentences: Sequence[Sentence], label_names: Sequence[str]) -> None:
    """ValueError naming the first label of `sentences` outside `label_names` (the labels
    training saw)."""
    known = set(label_names)
    for sentence in sentences:
        for offset, label in enumerate(sentence.labels or ()):
            if label not in known:
                raise ValueError(
                    f"{sentence.at(offset)}: label {label!r} was never seen in training "
                    f"(labels: {', '.join(label_names)}); fix the label, or train with it."
                )


def read_tfds(
    name: str, split: str, label_feature: str, data_dir: str | None = None
) -> tuple[list[Sentence], list[str]]:
    """(sentences, the label names) of split `split` of the prepared TFDS builder `name` (e.g.
    conll2003: `tokens`, and the tag features `ner`, `pos`, `chunks`)."""
    import tensorflow_datasets as tfds

    from bert_flax.input_pipeline import records  # hides accelerators from TensorFlow

    records.keep_tensorflow_off_accelerators()
    builder = tfds.builder(name, data_dir=data_dir or None)
    names = list(builder.info.features[label_feature].feature.names)
    sentences = []
    for k, item in enumerate(tfds.as_numpy(builder.as_dataset(split=split))):
        words, labels = item["tokens"], item[label_feature]
        if len(words) != len(labels):
            raise ValueError(
                f"{name}/{split}:{k}: {len(words)} tokens but {len(labels)} {label_feature} "
                f"labels; prepare the builder again (tfds build {name})."
            )
        if len(words):
            sentences.append(
                Sentence(
                    tuple(w.decode("utf-8") for w in words),
                    tuple(names[i] for i in labels),
                    f"{name}/{split} example {k}",
                )
            )
    return sentences, names
