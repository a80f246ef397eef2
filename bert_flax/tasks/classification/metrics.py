"""The metrics of a classification or regression evaluation, computed once over the whole
evaluation set from its predictions (GLUE's official ones among them): accuracy, F1 of class 1
(MRPC, QQP), Matthews correlation (CoLA), Pearson and Spearman correlation (STS-B) and the mean
squared error.

    scores(("mcc", "accuracy"), logits, labels)    # {"mcc": ..., "accuracy": ...}

Correlations of a constant series are 0 here (scipy: nan), as scikit-learn's MCC is, so that a
run whose model has not yet learnt to vary still has a score.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """The share of predictions equal to their label."""
    return float(np.mean(predicted == labels))


def f1(predicted: np.ndarray, labels: np.ndarray) -> float:
    """F1 of class 1 (the positive class of a binary task); 0 when it is never predicted nor
    true."""
    hits = np.sum((predicted == 1) & (labels == 1))
    guessed, true = np.sum(predicted == 1), np.sum(labels == 1)
    return float(2 * hits / (guessed + true)) if guessed + true else 0.0


def matthews_corrcoef(predicted: np.ndarray, labels: np.ndarray) -> float:
    """The Matthews correlation of class ids (Gorodkin's multi-class form; 0 when either side
    is constant)."""
    classes = np.union1d(predicted, labels)
    true = (labels[:, None] == classes).sum(axis=0).astype(np.float64)
    guessed = (predicted[:, None] == classes).sum(axis=0).astype(np.float64)
    correct, total = float(np.sum(predicted == labels)), float(len(labels))
    covariance = correct * total - true @ guessed
    spread = (total**2 - true @ true) * (total**2 - guessed @ guessed)
    return float(covariance / np.sqrt(spread)) if spread > 0 else 0.0


def pearson(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Pearson's correlation (0 when either side is constant)."""
    x = predicted.astype(np.float64) - np.mean(predicted, dtype=np.float64)
    y = labels.astype(np.float64) - np.mean(labels, dtype=np.float64)
    spread = np.sqrt((x @ x) * (y @ y))
    return float(np.clip((x @ y) / spread, -1.0, 1.0)) if spread > 0 else 0.0


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values`, ties sharing their mean rank."""
    order = np.argsort(values, kind="stable")
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    ranked = np.empty(len(values), np.float64)
    ranked[order] = np.repeat(first + (counts + 1) / 2, counts)
    return ranked


def spearman(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson's of the ranks."""
    return pearson(ranks(predicted), ranks(labels))


def mse(predicted: np.ndarray, labels: np.ndarray) -> float:
    """The mean squared error."""
    return float(np.mean((predicted.astype(np.float64) - labels) ** 2))


@dataclasses.dataclass(frozen=True)
class Metric:
    function: Callable[[np.ndarray, np.ndarray], float]
    regression: bool  # of real-valued predictions (else of class ids)
    higher_is_better: bool = True


METRICS = {
    "accuracy": Metric(accuracy, regression=False),
    "f1": Metric(f1, regression=False),
    "mcc": Metric(matthews_corrcoef, regression=False),
    "pearson": Metric(pearson, regression=True),
    "spearman": Metric(spearman, regression=True),
    "mse": Metric(mse, regression=True, higher_is_better=False),
}


def check_metrics(names: Sequence[str], num_labels: int, field: str) -> None:
    """ValueError naming `field` unless every metric of `names` applies to a head of
    `num_labels` outputs (1: regression; F1 only to two classes)."""
    for name in names:
        if name not in METRICS:
            raise ValueError(f"{field}: unknown metric {name!r}; choose from {sorted(METRICS)}.")
        if METRICS[name].regression != (num_labels == 1) or (name == "f1" and num_labels != 2):
            kind = "regression" if num_labels == 1 else f"{num_labels} classes"
            fits = [n for n in METRICS if METRICS[n].regression == (num_labels == 1)]
            raise ValueError(f"{field}: {name!r} does not apply to {kind}; use one of {fits}.")


def predictions(logits: np.ndarray) -> np.ndarray:
    """Class ids (argmax of the logits), or the regression value of one output."""
    return logits[..., 0] if logits.shape[-1] == 1 else np.argmax(logits, axis=-1)


def scores(names: Sequence[str], logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Each metric of `names` of the predictions of `logits` [N, num_labels] against `labels`."""
    predicted = predictions(logits)
    return {name: METRICS[name].function(predicted, labels) for name in names}
