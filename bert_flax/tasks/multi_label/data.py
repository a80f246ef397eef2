"""Multi-label data: texts (or pairs) with a set of labels each, read from CSV/TSV/JSONL files,
and their packed rows.

    data = read_multi_label_files("train.jsonl", "dev.jsonl")      # a `labels` list column
    data = read_multi_label_files("train.csv", label_columns=("toxic", "insult"))  # 0/1 columns
    table = encode(vocab, data.splits["train"], max_seq_length=128)  # rows.batches packs it

A file gives each example's labels either as one `labels` column (a JSON list, or names joined by
`separator` in CSV/TSV; empty for none) or as one 0/1 column per label (`label_columns`). The
targets are a 0/1 matrix [N, K] over train's labels, carried per slot as `multi_labels` [B, D, K].
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bert_flax.data.tokenization import Vocab
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.rows import RowLayout
from bert_flax.tasks.classification import data as classification
from bert_flax.tasks.classification.reading import read_records

LABELS_COLUMN = "labels"
_TRUE, _FALSE = ("1", "1.0", "true", "yes"), ("0", "0.0", "false", "no")


@dataclasses.dataclass(frozen=True)
class MultiLabelSplit:
    """Texts (optionally pairs), their 0/1 targets [N, K] and stable example ids."""

    texts: list[str]
    texts_b: list[str] | None
    targets: np.ndarray  # float32 [N, K]
    ids: np.ndarray  # int32 [N]

    def __len__(self) -> int:
        return len(self.texts)


@dataclasses.dataclass(frozen=True)
class MultiLabelData:
    splits: dict[str, MultiLabelSplit]
    label_names: list[str]
    source: str


def _label_set(value: Any, separator: str, where: str) -> list[str]:
    """The label names of one `labels` cell: a list, a JSON list, or names joined by
    `separator` (empty: none)."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: `labels` {value!r} is not a JSON list.") from None
    if isinstance(value, str):
        return [name.strip() for name in value.split(separator) if name.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str | int) for v in value):
        raise ValueError(
            f"{where}: `labels` is {value!r}; give a list of label names or ids, or names "
            f"joined by {separator!r}."
        )
    return [str(v) for v in value]


def _flag(value: Any, column: str, where: str) -> bool:
    text = str(value).strip().lower()
    if text not in _TRUE + _FALSE:
        raise ValueError(f"{where}: label column `{column}` is {value!r}, not 0 or 1.")
    return text in _TRUE


def _read_split(
    path: str, label_columns: Sequence[str], separator: str
) -> tuple[list[str], list[str] | None, list[set[str]]]:
    """(texts, texts_b, label sets) of one file."""
    texts, texts_b, label_sets = [], [], []
    for line, record in read_records(path):
        where = f"{path}:{line}"
        needed = ("text", *(label_columns or (LABELS_COLUMN,)))
        missing = [column for column in needed if column not in record]
        if missing:
            raise ValueError(
                f"{where}: no column(s) {missing} (found {sorted(record)}); a multi-label file "
                f"needs `text` and `{LABELS_COLUMN}` (or the config's label_columns)."
            )
        texts.append(_text(record, "text", where))
        if "text_b" in record:
            texts_b.append(_text(record, "text_b", where))
        if label_columns:
            label_sets.append({c for c in label_columns if _flag(record[c], c, where)})
        else:
            label_sets.append(set(_label_set(record[LABELS_COLUMN], separator, where)))
    if not texts:
        raise ValueError(f"{path} holds no records; a multi-label file needs `text` and labels.")
    if texts_b and len(texts_b) != len(texts):
        raise ValueError(f"{path}: `text_b` must be in every record or in none.")
    return texts, texts_b or None, label_sets


def _text(record: Mapping[str, Any], column: str, where: str) -> str:
    value = record[column]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: `{column}` is {value!r}, not a non-empty string.")
    return value


def read_multi_label_files(
    train: str,
    validation: str | None = None,
    test: str | None = None,
    *,
    label_columns: Sequence[str] = (),
    separator: str = ",",
    seed: int = 0,
) -> MultiLabelData:
    """Labelled files, one a split (train alone: split 0.8/0.1/0.1 with `seed`). The label
    names are train's (sorted; `label_columns` in their order); a label of another split that
    train never has is an error naming its line."""
    files = {"train": train, "validation": validation, "test": test}
    read = {name: _read_split(p, label_columns, separator) for name, p in files.items() if p}
    names = list(label_columns) or sorted(set().union(*read["train"][2]))
    if len(names) < 2:
        raise ValueError(f"{train}: labels {names}; multi-label classification needs two or more.")
    index = {name: k for k, name in enumerate(names)}
    splits = {}
    for split, (texts, texts_b, label_sets) in read.items():
        targets = np.zeros((len(texts), len(names)), np.float32)
        for row, labels in enumerate(label_sets):
            unknown = sorted(labels - index.keys())
            if unknown:
                raise ValueError(
                    f"{files[split]}: example {row} has labels {unknown} that {train} never has "
                    f"(known: {names}); fix them or add training examples of them."
                )
            targets[row, [index[label] for label in labels]] = 1.0
        ids = np.arange(len(texts), dtype=np.int32)
        splits[split] = MultiLabelSplit(texts, texts_b, targets, ids)
    if validation is None:
        whole = splits["train"]
        parts = classification.split_indices(len(whole), seed)
        splits = {name: select(whole, indices) for name, indices in parts.items()}
    return MultiLabelData(splits, names, ", ".join(f"{k}: {v}" for k, v in files.items() if v))


def select(split: MultiLabelSplit, indices: np.ndarray) -> MultiLabelSplit:
    """The examples of `split` at `indices`, in that order."""
    return MultiLabelSplit(
        [split.texts[i] for i in indices],
        None if split.texts_b is None else [split.texts_b[i] for i in indices],
        split.targets[indices],
        split.ids[indices],
    )


@dataclasses.dataclass(frozen=True)
class EncodedMultiLabel:
    """A tokenized split (`classification.data.EncodedSplit`) with its targets: the `data.rows`
    table whose rows carry `multi_labels` [B, D, K] and `example_ids` [B, D]."""

    encoded: classification.EncodedSplit
    targets: np.ndarray  # float32 [N, K]

    def __len__(self) -> int:
        return len(self.encoded)

    @property
    def lengths(self) -> np.ndarray:
        return self.encoded.lengths

    @property
    def ids(self) -> np.ndarray:
        return self.encoded.ids

    @property
    def max_seq_length(self) -> int:
        return self.encoded.max_seq_length

    def tokens(self, example: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.encoded.tokens(example, position)

    def task_features(self, layout: RowLayout, shape: RowShape) -> dict[str, np.ndarray]:
        targets = np.where(layout.valid[..., None], self.targets[layout.source], 0.0)
        return {
            "multi_labels": targets.astype(np.float32),
            "example_ids": np.where(layout.valid, self.ids[layout.source], -1).astype(np.int32),
        }


def encode(vocab: Vocab, split: MultiLabelSplit, max_seq_length: int) -> EncodedMultiLabel:
    """`[CLS] a [SEP] (b [SEP])` of each example, cut as classification cuts them."""
    labelled = classification.LabelledSplit(
        split.texts, split.texts_b, np.zeros(len(split), np.int32), split.ids
    )
    return EncodedMultiLabel(
        classification.encode_split(vocab, labelled, max_seq_length), split.targets
    )
