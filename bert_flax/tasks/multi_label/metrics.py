"""Multi-label scores: micro and macro F1 of 0/1 label matrices, and the decision threshold that
maximises micro F1 (tuned on validation, then applied to test)."""

from __future__ import annotations

import numpy as np

# The thresholds `tune_threshold` tries: 0.05, 0.10, ..., 0.95.
THRESHOLDS = np.round(np.arange(0.05, 0.96, 0.05), 2)


def _f1(true_positives, predicted, actual):
    """2 tp / (predicted + actual), 0 where both are 0 (scikit-learn's `zero_division=0`)."""
    denominator = np.asarray(predicted + actual, np.float64)
    return np.where(denominator > 0, 2 * true_positives / np.maximum(denominator, 1), 0.0)


def f1_scores(targets: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """Micro F1 (over every label decision) and macro F1 (the mean of each label's F1) of 0/1
    matrices [N, K]."""
    targets, predictions = targets.astype(bool), predictions.astype(bool)
    tp = (targets & predictions).sum(axis=0)
    predicted, actual = predictions.sum(axis=0), targets.sum(axis=0)
    micro = _f1(tp.sum(), predicted.sum(), actual.sum())
    return {"micro_f1": float(micro), "macro_f1": float(np.mean(_f1(tp, predicted, actual)))}


def tune_threshold(targets: np.ndarray, probabilities: np.ndarray) -> float:
    """The threshold of `THRESHOLDS` with the best micro F1 (the lowest of ties)."""
    scores = [f1_scores(targets, probabilities >= t)["micro_f1"] for t in THRESHOLDS]
    return float(THRESHOLDS[int(np.argmax(scores))])


def scores(targets: np.ndarray, probabilities: np.ndarray, threshold: float) -> dict[str, float]:
    """Micro and macro F1 at `threshold`, the threshold, and the exact-match ratio (every label
    of an example right)."""
    predictions = probabilities >= threshold
    exact = np.mean(np.all(predictions == targets.astype(bool), axis=1))
    return {**f1_scores(targets, predictions), "threshold": threshold, "exact_match": float(exact)}
