"""Exact match and F1 of extractive answers, as the official SQuAD v1.1 evaluation computes them.

An answer is normalised (lowercased; punctuation, the articles a/an/the and extra whitespace
removed) and compared with each gold answer of its question: exact match is 1 when the strings
are equal, F1 the harmonic mean of token precision and recall (tokens counted with their
multiplicity); a question scores its best gold answer. SQuAD v2.0's unanswerable questions have
the empty string as their one gold answer, so only an empty prediction scores there.

    scores = evaluate(read_squad("dev-v1.1.json"), {"5733be28": "Saint Bernadette"})
    scores.exact_match, scores.f1   # percentages over every question of the file
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
from collections.abc import Iterable, Mapping, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, then the articles, then collapse whitespace."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 of the normalised strings (both empty: 1; one empty: 0)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if not common:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(metric, prediction: str, golds: Sequence[str]) -> float:
    """A question's score: its prediction against the best-matching gold answer."""
    return max(metric(prediction, gold) for gold in (golds or [""]))


@dataclasses.dataclass(frozen=True)
class Scores:
    exact_match: float  # percent
    f1: float  # percent
    questions: int
    missing: int  # questions with no prediction (scored 0, as the official script does)


def evaluate(golds: Iterable[tuple[str, Sequence[str]]], predictions: Mapping[str, str]) -> Scores:
    """EM and F1 in percent over `golds`' (question id, gold answer texts) pairs."""
    em = f1_sum = 0.0
    questions = missing = 0
    for question_id, answers in golds:
        questions += 1
        if question_id not in predictions:
            missing += 1
            continue
        em += best_over_golds(exact_match, predictions[question_id], answers)
        f1_sum += best_over_golds(f1, predictions[question_id], answers)
    if not questions:
        raise ValueError("No questions to evaluate: the gold set is empty.")
    return Scores(100 * em / questions, 100 * f1_sum / questions, questions, missing)
