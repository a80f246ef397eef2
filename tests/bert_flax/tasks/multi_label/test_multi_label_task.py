"""Multi-label classification: F1 against scikit-learn, the files it reads, its loss against a
numpy reference on packed rows, and a tiny fine-tune whose reported scores equal scikit-learn's on
the predictions it writes."""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest
from sklearn.metrics import f1_score
from transformers import AutoConfig, pipeline

from bert_flax.convert.finetuned import export_finetuned
from bert_flax.data import tokenization
from bert_flax.input_pipeline import rows as data_rows
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.model.config import BertConfig
from bert_flax.runs import parameters
from bert_flax.tasks.classification.model import BertForSequenceClassification
from bert_flax.tasks.multi_label import data, metrics
from bert_flax.tasks.multi_label.model import multi_label_loss
from bert_flax.tasks.multi_label.task import review_tags
from bert_flax.train import loop
from configs import multi_label as multi_label_config


@pytest.mark.parametrize("seed", range(4))
def test_f1_equals_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    targets = rng.random((40, 5)) < 0.3
    predictions = rng.random((40, 5)) < 0.3
    targets[:, 4] = predictions[:, 4] = False  # a label nobody has nor predicts: F1 0
    got = metrics.f1_scores(targets, predictions)
    for average in ("micro", "macro"):
        expected = f1_score(targets, predictions, average=average, zero_division=0)
        assert got[f"{average}_f1"] == pytest.approx(expected, abs=1e-12)


def test_tuned_threshold_is_the_best_of_the_grid():
    rng = np.random.default_rng(0)
    targets = rng.random((60, 3)) < 0.5
    probabilities = np.clip(targets * 0.3 + rng.random((60, 3)) * 0.6, 0, 1)
    best = metrics.tune_threshold(targets, probabilities)
    by_sklearn = [
        f1_score(targets, probabilities >= t, average="micro") for t in metrics.THRESHOLDS
    ]
    assert f1_score(targets, probabilities >= best, average="micro") == pytest.approx(
        max(by_sklearn)
    )


def write(path, text):
    path.write_text(text)
    return str(path)


def test_reads_a_list_column_names_joined_and_one_column_per_label(tmp_path):
    jsonl = write(
        tmp_path / "t.jsonl",
        '{"text": "a", "labels": ["x", "y"]}\n{"text": "b", "labels": []}\n'
        '{"text": "c", "labels": ["z"]}\n',
    )
    csv_file = write(tmp_path / "t.csv", 'text,labels\na,"x,y"\nb,\nc,z\n')
    columns = write(tmp_path / "c.tsv", "text\tx\ty\tz\na\t1\t1\t0\nb\t0\t0\t0\nc\t0\t0\t1\n")
    for read in (
        data.read_multi_label_files(jsonl, jsonl),
        data.read_multi_label_files(csv_file, csv_file),
        data.read_multi_label_files(columns, columns, label_columns=("x", "y", "z")),
    ):
        assert read.label_names == ["x", "y", "z"]
        np.testing.assert_array_equal(
            read.splits["validation"].targets, [[1, 1, 0], [0, 0, 0], [0, 0, 1]]
        )


@pytest.mark.parametrize(
    "train, dev, columns, message",
    [
        ('{"text": "a", "labels": ["x", "y"]}\n', '{"text": "a", "labels": ["w"]}\n', (), "['w']"),
        ('{"text": "a", "tags": ["x", "y"]}\n', None, (), "no column(s) ['labels']"),
        ('{"text": "a", "x": 2, "y": 0}\n', None, ("x", "y"), "not 0 or 1"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, train, dev, columns, message):
    train = write(tmp_path / "train.jsonl", train)
    dev = write(tmp_path / "dev.jsonl", dev) if dev else None
    with pytest.raises(ValueError, match=re.escape(message)):
        data.read_multi_label_files(train, dev, label_columns=columns)


def test_packed_loss_equals_numpy_reference():
    """Mean over real sequences of the mean binary cross-entropy over labels, from the logits of
    each sequence alone (one a row)."""
    config = BertConfig.preset(
        "tiny",
        num_layers=1,
        hidden_size=32,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    texts = ["a film", "bad!", "the movie is long and dull", "fine", "what?", "yes"]
    targets = np.random.default_rng(0).integers(0, 2, (len(texts), 3)).astype(np.float32)
    split = data.MultiLabelSplit(texts, None, targets, np.arange(len(texts), dtype=np.int32))
    table = data.encode(tokenization.load_vocab(), split, 32)
    model = BertForSequenceClassification(config, 3)
    packed = data_rows.build_rows(table, [[0, 1, 2], [3, 4, 5]], RowShape(32, 3))
    params = model.init(jax.random.key(0), packed, deterministic=True)["params"]
    loss, _ = multi_label_loss(model.apply({"params": params}, packed, deterministic=True), packed)
    per_sequence = []
    for k in range(len(texts)):
        row = data_rows.build_rows(table, [[k]], RowShape(32, 1))
        logits = np.asarray(model.apply({"params": params}, row, deterministic=True).logits[0, 0])
        p = 1 / (1 + np.exp(-logits.astype(np.float64)))
        per_sequence.append(-np.mean(targets[k] * np.log(p) + (1 - targets[k]) * np.log(1 - p)))
    assert float(loss) == pytest.approx(np.mean(per_sequence), rel=1e-4)


@pytest.mark.slow(seconds=40)
def test_fine_tune_reports_scikit_learns_f1_of_what_it_writes_and_exports(tmp_path):
    config = multi_label_config.get_config()
    # Enough steps (~130) to learn the `film` rule: varied predictions to score.
    config.data.update(train_examples=3000, max_seq_length=64)
    config.train.epochs = 1.4
    config.schedule.learning_rate = 2e-3
    config.eval.evaluations = 1
    workdir = str(tmp_path / "run")
    final = loop.train_and_evaluate(config, workdir)
    assert final["best"]["value"] > final["baseline"] + 0.1  # past the frequent labels
    records = [json.loads(line) for line in open(final["test"]["path"])]
    with open(f"{workdir}/best/best.json") as f:
        names = json.load(f)["label_names"]
    predicted = np.array([[name in r["labels"] for name in names] for r in records])
    targets = review_tags(seed=config.data.split_seed).splits["test"].targets.astype(bool)
    assert len(records) == len(targets)
    for average in ("micro", "macro"):
        expected = f1_score(targets, predicted, average=average, zero_division=0)
        assert final["test"][f"{average}_f1"] == pytest.approx(expected)
    # Exported, transformers' pipeline gives the same probability of every label.
    out = str(tmp_path / "hf")
    model_config, params, head = parameters.load_finetuned(workdir)
    export_finetuned(params, model_config, head, out)
    assert AutoConfig.from_pretrained(out).problem_type == "multi_label_classification"
    classify = pipeline("text-classification", model=out, top_k=None, function_to_apply="sigmoid")
    texts = review_tags(seed=config.data.split_seed).splits["test"].texts[:8]
    for theirs, ours in zip(classify(texts), records):
        by_label = {s["label"]: s["score"] for s in theirs}
        np.testing.assert_allclose(
            [by_label[n] for n in names], [ours["probabilities"][n] for n in names], atol=1e-5
        )
