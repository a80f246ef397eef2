"""Logits to answers: the best span over windows, mapped back to the context's characters,
against a brute-force search; v2.0's no-answer margin and threshold."""

import itertools

import numpy as np
import pytest

from bert_flax.data.tokenization import load_vocab
from bert_flax.tasks.squad import predictions, reading

CONTEXT = (
    "In 1066 William of Normandy crossed the Channel and defeated Harold at Hastings; "
    "he was crowned king of England on Christmas Day of that year in Westminster Abbey."
)


@pytest.fixture(scope="module")
def windows():
    example = reading.Example("q", "Who won at Hastings?", CONTEXT, ())
    return example, reading.to_windows(example, load_vocab(), max_seq_length=24, doc_stride=6)


def brute_force(example, windows, starts, ends, max_answer_length):
    """Every (window, start, end) over context tokens, no n-best cut."""
    best = (-np.inf, "")
    for window, s_logits, e_logits in zip(windows, starts, ends):
        context = np.flatnonzero(window.context_mask)
        for s, e in itertools.product(context, context):
            if s <= e < s + max_answer_length:
                text = example.context[window.char_spans[s, 0] : window.char_spans[e, 1]]
                best = max(best, (float(s_logits[s] + e_logits[e]), text))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_the_best_span_over_windows_is_the_brute_force_one(windows, seed):
    example, windows = windows
    rng = np.random.default_rng(seed)
    starts = [rng.standard_normal(len(w.input_ids)) for w in windows]
    ends = [rng.standard_normal(len(w.input_ids)) for w in windows]
    got = predictions.predict(example, windows, starts, ends, n_best=100, max_answer_length=5)
    assert (got.score, got.text) == pytest.approx(brute_force(example, windows, starts, ends, 5))
    null = min(s[0] + e[0] for s, e in zip(starts, ends))
    assert got.null_margin == pytest.approx(null - got.score)


def test_a_planted_answer_comes_back_as_the_contexts_own_text(windows):
    example, windows = windows
    target = "William of Normandy"
    char = CONTEXT.index(target)
    starts = [np.zeros(len(w.input_ids)) for w in windows]
    ends = [np.zeros(len(w.input_ids)) for w in windows]
    for window, s, e in zip(windows, starts, ends):
        spans = window.char_spans
        s[(spans[:, 0] == char)] = 5.0
        e[(spans[:, 1] == char + len(target))] = 5.0
    assert predictions.predict(example, windows, starts, ends).text == target


def test_the_null_threshold_keeps_the_most_exact_matches():
    made = lambda margin: predictions.Prediction("x", 0.0, margin)
    margins = {"a": 0.0, "c1": 1.0, "c2": 2.0, "d": 3.0}
    preds = {q: made(m) for q, m in margins.items()}
    # a and d: answerable, their spans right; c1, c2: no answer. Thresholds by exact matches:
    # below 0: 2 (c1, c2); at 0: 3; at 1: 2; at 2: 1; at 3: 2. The best keeps only a's span.
    has_answer = {"a": True, "c1": False, "c2": False, "d": True}
    exact = {"a": 1.0, "c1": 0.0, "c2": 0.0, "d": 1.0}
    threshold = predictions.best_null_threshold(preds, has_answer, exact)
    assert threshold == 0.0
    assert [predictions.answer_text(preds[q], threshold) for q in margins] == ["x", "", "", ""]
    assert predictions.answer_text(preds["c1"], None) == "x"  # v1.1: always a span
