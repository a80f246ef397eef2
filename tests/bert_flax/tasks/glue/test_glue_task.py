"""GLUE fine-tuning on a tiny GLUE folder: every evaluation scores the task's metrics on each
dev set (MNLI: matched and mismatched), as scikit-learn scores the best parameters'
predictions; the submission files have one exact line per test example."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as sk

from bert_flax.tasks import task_class
from bert_flax.tasks.glue import reading
from bert_flax.tasks.glue import task as glue_task
from bert_flax.tasks.glue.table import GLUE
from bert_flax.train import loop
from configs import glue


def tiny_config(key: str, glue_dir: str):
    """configs/glue.py:<key> at its smallest: one layer, 32 tokens, one epoch, padded rows."""
    config = glue.get_config(key)
    config.data.glue_dir = glue_dir
    config.model.num_layers, config.model.max_position_embeddings = 1, 64
    config.data.max_seq_length, config.data.packed = 32, False
    config.train.epochs, config.train.batch_size, config.eval.evaluations = 1.0, 8, 2
    config.eval.batch_size = 10  # several eval batches, the last one padded
    config.log.plots = False
    return config


def submission_frame(path) -> pd.DataFrame:
    frame = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False)
    assert list(frame.columns) == ["index", "prediction"]
    return frame


def test_mnli_scores_both_dev_sets_and_writes_its_and_axs_submissions(glue_dir, tmp_path):
    config = tiny_config("mnli", glue_dir)
    workdir = str(tmp_path / "mnli")
    final = loop.train_and_evaluate(config, workdir)
    records = [json.loads(line) for line in open(tmp_path / "mnli" / "metrics.jsonl")]
    evaluations = [r for r in records if r["split"] == "eval"]
    assert len(evaluations) == 2
    assert all({"accuracy", "accuracy_validation_mismatched"} <= set(r) for r in evaluations)
    task = task_class("glue")(config)
    best = final["best"]["eval"]
    for split, name in (("validation_matched", "accuracy"),
                        ("validation_mismatched", "accuracy_validation_mismatched")):  # fmt: skip
        lines = [json.loads(line) for line in open(task.predict_split(workdir, split)["path"])]
        predicted = [GLUE["mnli"].label_names.index(r["label"]) for r in lines]
        labels = task.labelled.splits[split].labels
        assert best[name] == pytest.approx(sk.accuracy_score(labels, predicted), abs=1e-6)
    # `--predict`: a labelled file scored as the evaluation scored it, a test file not.
    path = reading.tsv_path(GLUE["mnli"], glue_dir, "validation_mismatched")
    line = glue_task.predict_file(workdir, path, str(tmp_path / "mm.jsonl"))
    assert line.endswith(f"; accuracy {best['accuracy_validation_mismatched']:.4f}")
    path = reading.tsv_path(GLUE["mnli"], glue_dir, "test_matched")
    line = glue_task.predict_file(workdir, path, str(tmp_path / "m.jsonl"))
    assert line == f"24 predictions -> {tmp_path / 'm.jsonl'}"
    assert final["submissions"] == {"MNLI-m.tsv": 24, "MNLI-mm.tsv": 24, "AX.tsv": 24}
    for name, split, spec in (
        ("MNLI-m.tsv", "test_matched", GLUE["mnli"]),
        ("MNLI-mm.tsv", "test_mismatched", GLUE["mnli"]),
        ("AX.tsv", "test", GLUE["ax"]),
    ):
        frame = submission_frame(tmp_path / "mnli" / name)
        test = pd.read_csv(reading.tsv_path(spec, glue_dir, split), sep="\t", dtype=str,
                           quoting=csv.QUOTE_NONE, keep_default_na=False)  # fmt: skip
        assert frame["index"].tolist() == test["index"].tolist()
        assert set(frame["prediction"]) <= set(GLUE["mnli"].label_names)


@pytest.mark.parametrize("key", ["cola", "stsb"])
def test_submissions_write_labels_as_glue_does(glue_dir, tmp_path, key):
    """CoLA's predictions are 0/1, STS-B's float scores, one line per test example."""
    spec = GLUE[key]
    final = loop.train_and_evaluate(tiny_config(key, glue_dir), str(tmp_path))
    name = spec.splits["test"].submission
    assert final["submissions"] == {name: 24}
    lines = (tmp_path / name).read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 25
    frame = submission_frame(tmp_path / name)
    test = reading.read_glue_dir(spec, glue_dir).splits["test"]
    assert frame["index"].astype(int).tolist() == test.ids.tolist()
    if key == "cola":
        assert set(frame["prediction"]) <= {"0", "1"}
    else:
        assert np.isfinite(frame["prediction"].astype(float)).all()
        assert final["best"]["metric"] == "pearson" and "spearman" in final["best"]["eval"]


def test_mnli_from_tfds_has_its_splits_and_the_diagnostic_set():
    """configs/glue.py:mnli with config.data.dataset="tfds": TFDS's glue/mnli (mocked) and
    glue/ax, whose test split MNLI's model predicts into AX.tsv."""
    import tensorflow_datasets as tfds

    config = glue.get_config("mnli")
    config.data.dataset = "tfds"
    with tfds.testing.mock_data(num_examples=5):
        task = task_class("glue")(config)
    assert set(task.encoded) == {*GLUE["mnli"].splits, "ax"}
    assert task.submissions() == {
        "test_matched": ("MNLI-m.tsv", GLUE["mnli"]),
        "test_mismatched": ("MNLI-mm.tsv", GLUE["mnli"]),
        "ax": ("AX.tsv", GLUE["ax"]),
    }


def test_where_glue_is_must_be_said_and_files_must_name_the_splits(tmp_path):
    config = glue.get_config("mnli")
    with pytest.raises(ValueError, match=r"Say where GLUE is: config\.data\.glue_dir"):
        task_class("glue")(config)
    config.data.files = f"train={tmp_path}/t.csv,validation={tmp_path}/v.csv"
    with pytest.raises(ValueError, match=r"must name \['train', 'validation_matched'"):
        task_class("glue")(config)
