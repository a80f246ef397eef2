"""From start and end logits over an example's windows to its answer text (`predictions.json`)
and, for SQuAD v2.0, the no-answer decision.

In each window, the `n_best` highest start and end logits over the window's context tokens give
the candidate spans (start <= end, at most `max_answer_length` tokens), scored by the sum of
their logits; the candidates of every window compete, and the best is mapped back to the
context's characters through the window's `char_spans`. The no-answer score is the lowest
[CLS] start + end logit over the windows (the window most sure there is an answer); its margin
over the best span, `null_margin`, is what v2.0's threshold compares against
(`run_squad.py`'s `null_score_diff_threshold`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bert_flax.tasks.squad.reading import Example, Window


@dataclasses.dataclass(frozen=True)
class Prediction:
    text: str  # the best span's text in the context ("" when no window holds one)
    score: float  # its start + end logit
    null_margin: float  # no-answer score minus `score`: above a threshold, predict ""


def predict(
    example: Example,
    windows: Sequence[Window],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    n_best: int = 20,
    max_answer_length: int = 30,
) -> Prediction:
    """The answer of `example` from its windows' logits ([tokens] each, in window order)."""
    if not windows:
        raise ValueError(f"question {example.id!r} has no windows to predict from.")
    best_text, best_score = "", -np.inf
    null_score = np.inf
    for window, starts, ends in zip(windows, start_logits, end_logits, strict=True):
        null_score = min(null_score, float(starts[0] + ends[0]))
        for start, end in _spans(window, starts, ends, n_best, max_answer_length):
            score = float(starts[start] + ends[end])
            if score > best_score:
                first, last = window.char_spans[start, 0], window.char_spans[end, 1]
                best_text, best_score = example.context[first:last], score
    return Prediction(best_text, best_score, null_score - best_score)


def _spans(window: Window, starts, ends, n_best: int, max_answer_length: int):
    """The candidate (start, end) token pairs of one window."""
    context = np.flatnonzero(window.context_mask)
    top = lambda logits: context[np.argsort(-logits[context], kind="stable")[:n_best]]
    return [(s, e) for s in top(starts) for e in top(ends) if s <= e < s + max_answer_length]


def answer_text(prediction: Prediction, null_threshold: float | None) -> str:
    """The text `predictions.json` holds: "" for a v2.0 no-answer (margin above the threshold;
    `None`: v1.1, always the span)."""
    if null_threshold is not None and prediction.null_margin > null_threshold:
        return ""
    return prediction.text


def best_null_threshold(
    predictions: dict[str, Prediction], has_answer: dict[str, bool], exact: dict[str, float]
) -> float:
    """The null-margin threshold with the most exact matches over a v2.0 set (the official
    evaluation's `find_best_thresh`): below it a question keeps its span (worth `exact[id]`),
    above it it is answered "" (right when it has no answer)."""
    order = sorted(predictions, key=lambda q: predictions[q].null_margin)
    # Threshold below every margin: every question answered "".
    score = best = sum(not has_answer[q] for q in order)
    threshold = predictions[order[0]].null_margin - 1.0 if order else 0.0
    for q in order:  # raise the threshold past q's margin: q keeps its span
        score += exact[q] - (not has_answer[q])
        if score > best:
            best, threshold = score, predictions[q].null_margin
    return threshold
