"""A GLUE task's splits, as the `LabelledData` that `ClassificationTask` trains on, from any of
the places it is distributed (`table.GLUE` says what each holds):

    read_glue_dir(GLUE["rte"], "glue_data")       # the GLUE download: glue_data/RTE/train.tsv ...
    read_tfds(GLUE["rte"], data_dir=None)          # TFDS glue/rte, prepared beforehand
    # the Hugging Face `datasets` export's columns, in CSV, TSV, JSONL or Parquet files:
    read_files(GLUE["rte"], {"train": "train.parquet", "validation": "dev.jsonl"})

Label ids are the table's (TFDS's and Hugging Face's); a test split is unlabelled (class -1,
target NaN). Example ids are the files' `index`/`idx` column (what the submission files name),
else the record's position. Bad input raises ValueError naming the file, line and fix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from bert_flax.tasks.classification.data import LabelledData, LabelledSplit
from bert_flax.tasks.classification.reading import read_records
from bert_flax.tasks.glue.table import Spec

# (where, record): "path:line" of a record, and its columns.
Records = Iterable[tuple[str, Mapping[str, Any]]]


def label_id(spec: Spec, value: Any, where: str) -> int | float:
    """The id of a class label (its TSV form, name or id) or a regression target; -1 (the
    Hugging Face export's test label): unlabelled, -1 or NaN."""
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if spec.label_names is None:
        try:
            target = float(value)
        except (TypeError, ValueError):
            target = math.nan
        if target == -1:  # the Hugging Face export's test splits
            return math.nan
        if not math.isfinite(target):
            raise ValueError(f"{where}: score {value!r} is not a number; fix or drop the row.")
        return target
    text = str(value).strip()
    if text == "-1":  # the Hugging Face export's test splits
        return -1
    for names in (spec.tsv_labels, spec.label_names):
        if text in names:
            return names.index(text)
    if text.isdigit() and int(text) < len(spec.label_names):
        return int(text)
    raise ValueError(
        f"{where}: label {value!r} is not one of {spec.key}'s labels {list(spec.label_names)} "
        f"(or their ids 0..{len(spec.label_names) - 1}); fix the label or give the task's file."
    )


def example_id(record: Mapping[str, Any], column: str, position: int, where: str) -> int:
    """The record's integer `column` (the files' index), else its position."""
    if column not in record:
        return position
    try:
        return int(record[column])
    except (TypeError, ValueError):
        raise ValueError(f"{where}: `{column}` is {record[column]!r}, not an integer.") from None


def build_split(
    spec: Spec,
    records: Records,
    *,
    texts: Sequence[str],
    label: str | None,
    index: str,
    source: str,
) -> LabelledSplit:
    """The split of `records`: `texts` columns, `label` column (None: unlabelled) and example
    ids from the `index` column (else positions)."""
    regression = spec.label_names is None
    unlabelled = math.nan if regression else -1
    columns: list[list[str]] = [[] for _ in texts]
    labels: list[int | float] = []
    ids: list[int] = []
    for k, (where, record) in enumerate(records):
        missing = [c for c in (*texts, label) if c is not None and c not in record]
        if missing:
            raise ValueError(
                f"{where}: no column(s) {missing} (found {sorted(record)}); {spec.key} files "
                f"have {[*texts, label] if label else list(texts)}: give the task's file."
            )
        for column, values in zip(texts, columns):
            value = record[column]
            value = value.decode("utf-8") if isinstance(value, bytes) else value
            if not isinstance(value, str):
                raise ValueError(f"{where}: `{column}` is {value!r}, not text; fill the row.")
            values.append(value)
        labels.append(label_id(spec, record[label], where) if label else unlabelled)
        ids.append(example_id(record, index, k, where))
    if not ids:
        raise ValueError(f"{source} holds no examples; give the task's file.")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: the `{index}` column repeats a value; each must be unique.")
    return LabelledSplit(
        texts=columns[0],
        texts_b=columns[1] if len(columns) > 1 else None,
        labels=np.asarray(labels, np.float32 if regression else np.int32),
        ids=np.asarray(ids, np.int32),
    )


def _file_records(
    path: str, fieldnames: Sequence[str] | None = None, malformed: list[int] | None = None
) -> Records:
    records = read_records(path, fieldnames, malformed)
    return ((f"{path}:{line}", record) for line, record in records)


def tsv_path(spec: Spec, glue_dir: str, split: str) -> str:
    """Where the GLUE download keeps `split` of `spec`."""
    return os.path.join(glue_dir, spec.folder, spec.splits[split].file + ".tsv")


# The share of a labelled file's rows that may not fit its columns (the download's QQP has a
# few): skipped, as Hugging Face's GLUE loader skips them; more is a file of another layout.
MAX_MALFORMED = 0.01


def skip_malformed(path: str, lines: list[int], kept: int) -> None:
    """Warns of the rows at `lines` skipped for not fitting the columns, or raises ValueError
    naming the first when they are more than `MAX_MALFORMED` of the file (a test split must
    predict every row: its reader skips none)."""
    if len(lines) > MAX_MALFORMED * (len(lines) + kept):
        raise ValueError(
            f"{path}:{lines[0]}: the row's fields do not match the header's columns ({len(lines)} "
            f"of {len(lines) + kept} rows); fix its separators or give the task's file."
        )
    shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
    logging.warning(
        "%s: skipped %d rows that do not fit its columns (lines %s)", path, len(lines), shown
    )


def read_glue_dir(spec: Spec, glue_dir: str, splits: Sequence[str] | None = None) -> LabelledData:
    """`splits` (default all) of `spec` from the GLUE download's folder `glue_dir`."""
    found = {}
    for name in splits or spec.splits:
        split, path = spec.splits[name], tsv_path(spec, glue_dir, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path} is missing: a GLUE folder holds {spec.folder}/{split.file}.tsv for "
                f"{spec.key} (as download_glue_data.py lays it out); give the folder that has it."
            )
        headerless = spec.headerless if split.labelled else None
        malformed: list[int] | None = [] if split.labelled else None
        records = list(_file_records(path, headerless or None, malformed))
        if malformed:
            skip_malformed(path, malformed, len(records))
        found[name] = build_split(
            spec,
            records,
            texts=spec.tsv_texts,
            label=spec.tsv_label if split.labelled else None,
            index=spec.tsv_index,
            source=path,
        )
    return LabelledData(found, _names(spec), f"{os.path.join(glue_dir, spec.folder)} (GLUE)")


def read_files(spec: Spec, files: Mapping[str, str]) -> LabelledData:
    """The splits `files` names ({split: path}), in the Hugging Face export's columns."""
    found = {}
    for name, path in files.items():
        labelled = name in spec.splits and spec.splits[name].labelled
        found[name] = build_split(
            spec,
            _file_records(path),
            texts=spec.texts,
            label="label" if labelled else None,
            index="idx",
            source=path,
        )
    return LabelledData(found, _names(spec), ", ".join(f"{k}: {v}" for k, v in files.items()))


def read_file(spec: Spec, path: str) -> LabelledSplit:
    """The examples of one file of `spec`'s task, in the download's TSV columns (CoLA's train
    and dev without header) or the Hugging Face export's; labelled if it has the label column."""
    layouts = [
        (spec.texts, "label", "idx", None),
        (spec.tsv_texts, spec.tsv_label, spec.tsv_index, None),
        (spec.tsv_texts, spec.tsv_label, spec.tsv_index, spec.headerless or None),
    ]
    for texts, label, index, fieldnames in layouts:
        first = next((record for _, record in read_records(path, fieldnames)), {})
        if all(column in first for column in texts):
            return build_split(
                spec,
                _file_records(path, fieldnames),
                texts=texts,
                label=label if label in first else None,
                index=index,
                source=path,
            )
    raise ValueError(
        f"{path}:1: its columns fit neither {spec.key}'s GLUE TSVs ({list(spec.tsv_texts)}) nor "
        f"the Hugging Face export ({list(spec.texts)}); give a file of the task."
    )


def read_tfds(spec: Spec, data_dir: str | None = None) -> LabelledData:
    """Every split of TFDS `glue/<key>`, prepared beforehand under `data_dir` (nothing is
    downloaded here); TensorFlow kept off the accelerators."""
    import tensorflow_datasets as tfds

    from bert_flax.input_pipeline import records

    records.keep_tensorflow_off_accelerators()
    builder = tfds.builder(f"glue/{spec.key}", data_dir=data_dir)
    found = {}
    for name, split in spec.splits.items():
        source = f"TFDS glue/{spec.key} split {name}"
        try:
            examples = tfds.as_numpy(builder.as_dataset(split=name, shuffle_files=False))
        except AssertionError as error:  # what TFDS raises for data it has not prepared
            raise FileNotFoundError(
                f"{source} is not prepared under {builder.data_dir} ({error}); prepare it where "
                f"there is network (`tfds build glue/{spec.key} --data_dir=DIR`)."
            ) from None
        found[name] = build_split(
            spec,
            ((f"{source} example {k}", e) for k, e in enumerate(examples)),
            texts=spec.texts,
            label="label" if split.labelled else None,
            index="idx",
            source=source,
        )
    return LabelledData(found, _names(spec), f"TFDS glue/{spec.key} ({builder.data_dir})")


def _names(spec: Spec) -> list[str] | None:
    return None if spec.label_names is None else list(spec.label_names)
