"""EM and F1 against cases computed by hand with the official v1.1 script's rules."""

import pytest

from bert_flax.tasks.squad import metrics


def test_normalisation_drops_case_punctuation_articles_and_spaces():
    assert metrics.normalize_answer("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert metrics.normalize_answer("An apple a day") == "apple day"
    assert metrics.normalize_answer("theatre") == "theatre"  # "the" only as a word


@pytest.mark.parametrize(
    ("prediction", "gold", "em", "f1"),
    [
        ("Denver Broncos", "denver broncos", 1.0, 1.0),
        ("the Denver Broncos", "Denver Broncos.", 1.0, 1.0),
        # 2 common tokens; precision 2/3, recall 2/2 -> F1 = 2 * (2/3) / (5/3) = 0.8
        ("Denver Broncos team", "Denver Broncos", 0.0, 0.8),
        # tokens count with their multiplicity: "a b b" vs "b": 1 common; P 1/2 ("a" dropped), R 1
        ("a b b", "b", 0.0, 2 * 0.5 * 1 / 1.5),
        ("Carolina Panthers", "Denver Broncos", 0.0, 0.0),
        ("", "", 1.0, 1.0),  # v2.0: an empty prediction for an unanswerable question
        ("Denver", "", 0.0, 0.0),
    ],
)
def test_exact_match_and_f1_of_one_answer(prediction, gold, em, f1):
    assert metrics.exact_match(prediction, gold) == em
    assert metrics.f1(prediction, gold) == pytest.approx(f1)


def test_a_question_scores_its_best_gold_and_a_missing_prediction_scores_zero():
    golds = [("q1", ["Denver Broncos", "Broncos"]), ("q2", ["1996"]), ("q3", ["x"])]
    scores = metrics.evaluate(golds, {"q1": "Broncos", "q2": "in 1996 and 1997"})
    # q1: EM 1, F1 1; q2: EM 0, F1 2*(1/4)*1/(5/4) = 0.4; q3: missing, 0.
    assert scores.exact_match == pytest.approx(100 / 3)
    assert scores.f1 == pytest.approx(100 * 1.4 / 3)
    assert (scores.questions, scores.missing) == (3, 1)


def test_an_empty_gold_set_is_an_error():
    with pytest.raises(ValueError, match="gold set is empty"):
        metrics.evaluate([], {})
