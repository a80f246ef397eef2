"""A synthetic data directory reads like real data: every pipeline mode, every example once."""

from __future__ import annotations

import collections

import numpy as np

from bert_flax.data import synthetic_records
from bert_flax.data.verify_packing import reference_examples, unpack_row
from bert_flax.input_pipeline import datasets, record_index, records


def test_synthetic_directory_packs_every_example_once(tmp_path):
    out = str(tmp_path / "synthetic")
    synthetic_records.write_data_dir(out, 3000, 128, num_shards=3, seed=1)
    files = records.find_shards(out, "train")
    reference = reference_examples(files)
    assert sum(reference.values()) == 3000
    scanned = record_index.RecordIndex.build(files)
    written = record_index.RecordIndex.load(record_index.index_path(out, "train"))
    np.testing.assert_array_equal(scanned.offsets, written.offsets)
    np.testing.assert_array_equal(scanned.num_predictions, written.num_predictions)
    for mode in ({}, {"pack_window": 700}, {"streaming": True}):
        options = datasets.InputOptions(
            repeat=False, drop_remainder=False, process_index=0, process_count=1, **mode
        )
        ds = datasets.packed_dataset(out, 64, options)
        seen: collections.Counter = collections.Counter()
        for batch in ds.as_numpy_iterator():
            for r in range(len(batch["input_ids"])):
                examples, problems = unpack_row({k: v[r] for k, v in batch.items()}, 101)
                assert not problems, (mode, problems)
                seen.update(examples)
        assert seen == reference, mode
