"""GLUE's splits read from the download's folder (against pandas reading the same TSVs), from
the Hugging Face export's files (CSV, TSV, JSONL, Parquet written by pandas) and from TFDS's
registered builders (mocked: their label names and splits are the table's); bad files refused
with the file, line and fix."""

from __future__ import annotations

import csv
import shutil
from unittest import mock

import numpy as np
import pandas as pd
import pytest

from bert_flax.tasks.glue import reading
from bert_flax.tasks.glue.table import GLUE, TRAINED


def pandas_split(spec, glue_dir: str, split: str) -> pd.DataFrame:
    """The split's TSV as pandas reads it (no quoting; CoLA's train and dev without header)."""
    headerless = spec.headerless and spec.splits[split].labelled
    return pd.read_csv(
        reading.tsv_path(spec, glue_dir, split),
        sep="\t",
        quoting=csv.QUOTE_NONE,
        header=None if headerless else 0,
        names=list(spec.headerless) if headerless else None,
        dtype=str,
        keep_default_na=False,
    )


@pytest.mark.parametrize("key", [*TRAINED, "ax"])
def test_the_glue_folder_reads_as_pandas_reads_it(glue_dir, key):
    spec = GLUE[key]
    data = reading.read_glue_dir(spec, glue_dir)
    assert list(data.splits) == list(spec.splits)
    assert data.label_names == (None if spec.label_names is None else list(spec.label_names))
    for name, split in data.splits.items():
        frame = pandas_split(spec, glue_dir, name)
        assert split.texts == frame[spec.tsv_texts[0]].tolist()
        if len(spec.tsv_texts) > 1:
            assert split.texts_b == frame[spec.tsv_texts[1]].tolist()
        else:
            assert split.texts_b is None
        if spec.tsv_index in frame:
            np.testing.assert_array_equal(split.ids, frame[spec.tsv_index].astype(int))
        if not spec.splits[name].labelled:
            assert (split.labels == -1).all() or np.isnan(split.labels).all()
        elif spec.label_names is None:
            np.testing.assert_allclose(split.labels, frame[spec.tsv_label].astype(float))
        else:
            expected = [spec.tsv_labels.index(v) for v in frame[spec.tsv_label]]
            np.testing.assert_array_equal(split.labels, expected)
            assert len(set(expected)) > 1


def hf_frame(spec, split) -> pd.DataFrame:
    """A split as the Hugging Face export writes it: its text columns, label id (-1 for test)
    and idx."""
    columns = {name: values for name, values in zip(spec.texts, (split.texts, split.texts_b))}
    return pd.DataFrame({**columns, "label": split.labels, "idx": split.ids})


WRITERS = {
    "csv": lambda frame, path: frame.to_csv(path, index=False),
    "tsv": lambda frame, path: frame.to_csv(path, sep="\t", index=False, quoting=csv.QUOTE_NONE),
    "jsonl": lambda frame, path: frame.to_json(path, orient="records", lines=True),
    "parquet": lambda frame, path: frame.to_parquet(path, index=False),
}


@pytest.mark.parametrize(("key", "kind"), [("rte", "csv"), ("stsb", "jsonl"), ("mnli", "parquet"),
                                           ("cola", "tsv"), ("qqp", "jsonl")])  # fmt: skip
def test_the_hugging_face_export_reads_as_the_glue_folder(glue_dir, tmp_path, key, kind):
    spec = GLUE[key]
    folder = reading.read_glue_dir(spec, glue_dir)
    files = {}
    for name, split in folder.splits.items():
        files[name] = str(tmp_path / f"{name}.{kind}")
        WRITERS[kind](hf_frame(spec, split), files[name])
    exported = reading.read_files(spec, files)
    for name, split in folder.splits.items():
        got = exported.splits[name]
        assert got.texts == split.texts and got.texts_b == split.texts_b
        np.testing.assert_array_equal(got.ids, split.ids)
        np.testing.assert_allclose(got.labels, split.labels, rtol=1e-6)


@pytest.mark.parametrize("key", [*TRAINED, "ax"])
def test_tfds_builders_read_as_tfds_gives_them(key):
    """TFDS's registered glue/<key> builder (mocked examples): the table's label names and text
    columns are the builder's, and every example is read as tfds.load gives it."""
    import tensorflow_datasets as tfds

    spec = GLUE[key]
    with tfds.testing.mock_data(num_examples=4):
        builder = tfds.builder(f"glue/{key}")
        data = reading.read_tfds(spec, None)
        assert set(data.splits) == set(spec.splits)
        features = builder.info.features
        assert set(spec.texts) < set(features)
        if spec.label_names is not None:
            assert tuple(features["label"].names) == spec.label_names
        for name, split in data.splits.items():
            examples = list(tfds.as_numpy(tfds.load(f"glue/{key}", split=name)))
            assert split.texts == [e[spec.texts[0]].decode() for e in examples]
            if spec.splits[name].labelled:
                np.testing.assert_allclose(split.labels, [e["label"] for e in examples])


def test_tfds_data_not_prepared_says_how_to_prepare_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="tfds build glue/rte"):
        reading.read_tfds(GLUE["rte"], str(tmp_path))


def test_bad_files_are_refused_naming_the_file_and_line(tmp_path):
    spec = GLUE["rte"]
    bad = tmp_path / "RTE"
    bad.mkdir()
    for name in ("dev", "test"):
        (bad / f"{name}.tsv").write_text("")
    with pytest.raises(FileNotFoundError, match=r"RTE/train\.tsv is missing"):
        reading.read_glue_dir(spec, str(tmp_path))
    (bad / "train.tsv").write_text("index\tsentence\tlabel\n0\ta\tentailment\n")
    with pytest.raises(ValueError, match=r"RTE/train\.tsv:2: no column\(s\) \['sentence1'"):
        reading.read_glue_dir(spec, str(tmp_path))
    (bad / "train.tsv").write_text(
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tneutral\n"
    )
    with pytest.raises(ValueError, match=r"RTE/train\.tsv:3: label 'neutral' is not one of"):
        reading.read_glue_dir(spec, str(tmp_path))
    (bad / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\nx\ta\tb\tentailment\n")
    with pytest.raises(ValueError, match=r"RTE/train\.tsv:2: `index` is 'x', not an integer"):
        reading.read_glue_dir(spec, str(tmp_path))
    (bad / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\n")
    with pytest.raises(ValueError, match=r"RTE/train\.tsv:2: the row's fields"):
        reading.read_glue_dir(spec, str(tmp_path))


def test_rows_that_do_not_fit_are_skipped_in_training_splits_not_in_test(glue_dir, tmp_path):
    """QQP's download has rows with fields missing: train and dev skip a few (counted in a
    warning), as Hugging Face's loader does; test must predict every row."""
    folder = tmp_path / "glue"
    shutil.copytree(glue_dir, folder)
    train = folder / "QQP" / "train.tsv"
    lines = train.read_text().splitlines()
    lines += [f"{k}\t1\t2\tq\tq\t0" for k in range(100, 200)]  # enough for one in 100 to skip
    train.write_text("\n".join([*lines[:3], "77\t1\t2\ta question", *lines[3:]]) + "\n")
    with mock.patch.object(reading.logging, "warning") as warn:
        read = reading.read_glue_dir(GLUE["qqp"], str(folder), ["train"])
    assert len(read.splits["train"]) == len(lines) - 1  # the header; the short row skipped
    assert warn.call_args.args[1:3] == (str(train), 1) and warn.call_args.args[3] == "4"
    test = folder / "QQP" / "test.tsv"
    test.write_text(test.read_text() + "999\tonly a question\n")
    with pytest.raises(ValueError, match=r"test.tsv:\d+: the row's fields do not match"):
        reading.read_glue_dir(GLUE["qqp"], str(folder), ["test"])
