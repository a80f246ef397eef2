"""verify_packing: passes on the real pipeline, and catches missing, duplicated, corrupted rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from absl import flags

from bert_flax.data import verify_packing
from bert_flax.input_pipeline import datasets

CLS = 101


@pytest.fixture(scope="module")
def row(data_dir) -> dict:
    """A real packed row holding at least two sequences and some padding."""
    options = datasets.InputOptions(repeat=False, process_index=0, process_count=1)
    ds = datasets.packed_dataset(data_dir, 64, options)
    for batch in ds.as_numpy_iterator():
        fits = (batch["sequence_mask"].sum(1) >= 2) & (batch["segment_ids"][:, -1] == 0)
        if fits.any():
            r = int(np.argmax(fits))
            return {k: v[r] for k, v in batch.items()}
    raise AssertionError("no packed row with two sequences and padding")


def test_real_pipeline_verifies(data_dir):
    report = verify_packing.verify(data_dir, batch_size=50)
    assert report["ok"], report
    assert report["examples_in"] == report["examples_out"] > 1000
    assert report["achieved_efficiency"] == pytest.approx(report["predicted_efficiency"], abs=0.01)
    assert report["rows_per_second"] > 0


def test_a_clean_row_unpacks_to_its_sequences(row):
    examples, problems = verify_packing.unpack_row(row, CLS)
    assert problems == [] and len(examples) == int(row["sequence_mask"].sum())


def corrupt(row, **changes) -> list[str]:
    bad = {k: v.copy() for k, v in row.items()}
    for name, edit in changes.items():
        edit(bad[name])
    return verify_packing.unpack_row(bad, CLS)[1]


def second_start(row) -> int:
    return int(row["cls_positions"][1])


def test_corrupted_rows_are_named(row):
    s = second_start(row)
    end = int((row["segment_ids"] > 0).sum())

    def positions_continue(p):
        p[s:end] = np.arange(s, end)

    def interleave(seg):
        seg[s + 1] = 1  # a token of sequence 2 claims to be in sequence 1

    def masked_into_padding(pos):
        pos[0] = end

    def dirty_padding(ids):
        ids[-1] = 7

    def wrong_nsp(nsp):
        nsp[1] += 1

    cases = {
        "positions do not restart": {"positions": positions_continue},
        "segment ids are not contiguous": {"segment_ids": interleave},
        "outside every sequence": {"masked_lm_positions": masked_into_padding},
        "input_ids is non-zero in the padding": {"input_ids": dirty_padding},
        "is not the [CLS]": {"cls_positions": wrong_nsp},
    }
    for message, change in cases.items():
        problems = corrupt(row, **change)
        assert any(message in p for p in problems), (message, problems)


def test_missing_and_duplicated_examples_are_counted(data_dir, monkeypatch):
    real = datasets.packed_dataset

    def drop_first_batch(*args, **kwargs):
        return real(*args, **kwargs).skip(1)

    def repeat_first_batch(*args, **kwargs):
        ds = real(*args, **kwargs)
        return ds.take(1).concatenate(ds)

    monkeypatch.setattr(datasets, "packed_dataset", drop_first_batch)
    report = verify_packing.verify(data_dir, split="validation", batch_size=16)
    assert not report["ok"] and report["missing"] >= 16 and report["duplicated"] == 0
    monkeypatch.setattr(datasets, "packed_dataset", repeat_first_batch)
    report = verify_packing.verify(data_dir, split="validation", batch_size=16)
    assert not report["ok"] and report["duplicated"] >= 16 and report["missing"] == 0


def test_command_line_exit_status(data_dir, monkeypatch, capsys):
    try:
        verify_packing.define_flags()
    except flags.DuplicateFlagError:
        pass
    flags.FLAGS(["verify_packing", f"--data_dir={data_dir}", "--json", "--split=validation"])
    with pytest.raises(SystemExit) as exit_info:
        verify_packing.main([])
    assert exit_info.value.code == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    monkeypatch.setattr(
        datasets,
        "packed_dataset",
        lambda *a, real=datasets.packed_dataset, **k: real(*a, **k).skip(1),
    )
    with pytest.raises(SystemExit) as exit_info:
        verify_packing.main([])
    assert exit_info.value.code == 1
