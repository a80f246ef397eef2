"""The evaluation metrics against scikit-learn and scipy: on random data (ties, constant series),
and on the predictions a fine-tuning run writes, which must score as its best evaluation did."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from bert_flax.tasks import task_class
from bert_flax.tasks.classification import metrics
from bert_flax.train import loop

CLASS_REFERENCES = {
    "accuracy": sk.accuracy_score,
    "f1": sk.f1_score,
    "mcc": sk.matthews_corrcoef,
}
REGRESSION_REFERENCES = {
    "pearson": lambda x, y: stats.pearsonr(x, y)[0],
    "spearman": lambda x, y: stats.spearmanr(x, y)[0],
    "mse": sk.mean_squared_error,
}


@pytest.mark.parametrize("seed", range(6))
def test_class_metrics_match_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    n, classes = int(rng.integers(5, 200)), 2 if seed < 4 else 3
    labels = rng.integers(0, classes, n)
    predicted = np.where(rng.random(n) < 0.6, labels, rng.integers(0, classes, n))
    for name, reference in CLASS_REFERENCES.items():
        if name == "f1" and classes > 2:
            continue
        got = getattr(metrics, metrics.METRICS[name].function.__name__)(predicted, labels)
        assert got == pytest.approx(reference(labels, predicted), abs=1e-12), name


def test_class_metrics_of_constant_predictions_match_scikit_learn():
    labels = np.array([0, 1, 1, 0, 1])
    for predicted in (np.zeros(5, int), np.ones(5, int)):
        for name, reference in CLASS_REFERENCES.items():
            got = metrics.METRICS[name].function(predicted, labels)
            assert got == pytest.approx(reference(labels, predicted, **_quiet(name)), abs=1e-12)


def _quiet(name: str) -> dict:
    return {"zero_division": 0.0} if name == "f1" else {}


@pytest.mark.parametrize("seed", range(6))
def test_regression_metrics_match_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 300))
    labels = rng.integers(0, 6, n).astype(np.float32)  # as STS-B's 0..5: many ties
    predicted = (labels + rng.normal(0, 2, n)).astype(np.float32)
    if seed % 2:
        predicted = np.round(predicted)  # ties on both sides
    logits = predicted[:, None]
    found = metrics.scores(list(REGRESSION_REFERENCES), logits, labels)
    for name, reference in REGRESSION_REFERENCES.items():
        assert found[name] == pytest.approx(reference(predicted, labels), abs=1e-6), name
    assert metrics.pearson(np.full(n, 2.5), labels) == 0.0  # scipy: nan (constant input)


def test_scores_take_the_argmax_of_the_logits():
    logits = np.array([[0.1, 2.0], [3.0, -1.0], [0.0, 0.5]])
    labels = np.array([1, 1, 1])
    assert metrics.scores(["accuracy", "f1"], logits, labels) == pytest.approx(
        {"accuracy": 2 / 3, "f1": sk.f1_score(labels, [1, 0, 1])}
    )


@pytest.mark.parametrize(
    ("names", "num_labels", "message"),
    [
        (["acc"], 2, "unknown metric"),
        (["pearson"], 2, "does not apply to 2 classes"),
        (["mcc"], 1, "does not apply to regression"),
        (["f1"], 3, "does not apply to 3 classes"),
    ],
)
def test_metrics_that_do_not_fit_the_head_are_refused(names, num_labels, message):
    with pytest.raises(ValueError, match=message):
        metrics.check_metrics(names, num_labels, "config.eval.metrics")


TRAIN = "text,label\n" + "".join(
    f"{word} film number {i},{label}\n"
    for i in range(40)
    for word, label in (("a great", 1), ("an awful", 0), ("a fine", 1))
)
VALIDATION = "text,label\n" + "".join(
    f"{word} film {i},{label}\n"
    for i in range(15)
    for word, label in (("a great", 1), ("an awful", 0), ("a dull", 0))
)


def test_a_fine_tune_reports_the_metrics_of_its_predictions(tmp_path):
    """Every evaluation reports MCC, F1 and accuracy over the whole validation split; the best
    one's equal scikit-learn's on the predictions the best parameters write for it, and the
    best is chosen by config.eval.metric. A test file without labels is only predicted."""
    from configs import finetune_sentiment

    unlabelled = "text\n" + "".join(f"a film {i}\n" for i in range(7))
    for name, text in (("train.csv", TRAIN), ("dev.csv", VALIDATION), ("test.csv", unlabelled)):
        (tmp_path / name).write_text(text)
    config = finetune_sentiment.get_config()
    config.data.train_file, config.data.validation_file, config.data.test_file = (
        str(tmp_path / name) for name in ("train.csv", "dev.csv", "test.csv")
    )
    config.model.num_layers, config.model.max_position_embeddings = 1, 64
    config.data.max_seq_length, config.train.epochs, config.eval.evaluations = 32, 2.0, 3
    config.eval.metrics, config.eval.metric = "mcc,f1,accuracy", "f1"
    config.eval.batch_size = 2  # several eval batches, the last one padded
    config.log.plots = False
    workdir = str(tmp_path / "run")
    final = loop.train_and_evaluate(config, workdir)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    evaluations = [r for r in records if r["split"] == "eval"]
    assert len(evaluations) == 3
    best = final["best"]
    assert best["metric"] == "f1"
    assert best["value"] == max(e["f1"] for e in evaluations)
    assert list(final["test"]) == ["path"]  # an unlabelled test file: only predicted
    assert len(open(final["test"]["path"]).readlines()) == 7
    task = task_class("classification")(config)
    scored = task.predict_split(workdir, "validation")
    lines = [json.loads(line) for line in open(scored["path"])]
    predicted = np.array([task.labelled.label_names.index(r["label"]) for r in lines])
    labels = task.labelled.splits["validation"].labels
    for name, reference in CLASS_REFERENCES.items():
        assert best["eval"][name] == pytest.approx(reference(labels, predicted), abs=1e-6), name
        assert scored[name] == pytest.approx(reference(labels, predicted), abs=1e-6), name
