"""The record index against an independent scan of the shards, and reading by byte range."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from bert_flax.input_pipeline import record_index, records
from bert_flax.input_pipeline.record_index import RecordIndex


def test_written_index_equals_a_scan_of_the_shards(data_dir):
    written = RecordIndex.load(record_index.index_path(data_dir, "train"))
    scanned = RecordIndex.build(records.find_shards(data_dir, "train"))
    for field in ("files", "file_ids", "offsets", "sizes", "lengths", "num_predictions"):
        np.testing.assert_array_equal(getattr(written, field), getattr(scanned, field), field)
    table = records.read_table(records.find_shards(data_dir, "train"), 128, 20)
    np.testing.assert_array_equal(written.lengths, table.lengths)  # TFRecordDataset's order
    np.testing.assert_array_equal(written.num_predictions, table.num_predictions)


def test_reading_records_by_byte_range_equals_reading_them_all(data_dir):
    index = RecordIndex.load_or_build(data_dir, "train")
    table = records.read_table(records.find_shards(data_dir, "train"), 128, 20)
    rng = np.random.default_rng(0)
    wanted = np.concatenate([rng.permutation(len(index))[:300], np.arange(40, 90)])  # runs too
    got = index.read(wanted, 128, 20, data_dir)
    expected = table.select(wanted)
    for field in ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids",
                  "next_sentence_labels", "lengths", "num_predictions"):  # fmt: skip
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), field)
    assert len(index.read(np.zeros(0, np.int64), 128, 20, data_dir)) == 0


def test_a_missing_or_stale_index_is_rebuilt_and_a_broken_shard_is_named(data_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy, ignore=shutil.ignore_patterns("index"))
    built = RecordIndex.load_or_build(str(copy), "train")  # no index/: scanned and cached
    assert os.path.isfile(record_index.index_path(str(copy), "train"))
    shard = records.find_shards(str(copy), "train")[0]
    with open(shard, "ab") as f:  # the shard grows: the cached index is stale
        f.write(open(records.find_shards(str(copy), "train")[1], "rb").read())
    rebuilt = RecordIndex.load_or_build(str(copy), "train")
    assert len(rebuilt) > len(built)
    with open(shard, "ab") as f:
        f.write(b"\x05\x00")  # a torn frame header
    with pytest.raises(ValueError, match="ends inside a record"):
        RecordIndex.load_or_build(str(copy), "train")
