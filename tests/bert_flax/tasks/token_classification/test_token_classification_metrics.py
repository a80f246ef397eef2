"""Entity scores against seqeval's strict mode (the independent reference) on random and
edge-case tag sequences of each scheme, and conversions between schemes."""

import random
import warnings

import pytest
from seqeval.metrics import classification_report
from seqeval.metrics.sequence_labeling import accuracy_score
from seqeval.scheme import IOB1, IOB2, IOBES, Entities

from bert_flax.tasks.token_classification import metrics

SEQEVAL = {"IOB1": IOB1, "IOB2": IOB2, "BIOES": IOBES}
EDGE_CASES = [
    [[], ["O"]],  # an empty sentence, no entity
    [["I-PER", "I-PER", "B-PER", "O"]],
    [["B-PER", "I-LOC", "E-LOC"], ["S-PER", "E-PER"]],
    [["O", "I-PER", "B-LOC", "I-LOC", "I-LOC"], ["B-PER", "B-PER", "I-PER"]],
]


def all_tags(scheme):
    return ["O"] + [f"{p}-{t}" for p in metrics.PREFIXES[scheme] for t in ("PER", "LOC", "X")]


def reference(golds, predictions, scheme, mode="strict"):
    """seqeval's figures: strict mode with `scheme`, or its default (conlleval's) mode."""
    strict = {"mode": "strict", "scheme": SEQEVAL[scheme]} if mode == "strict" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = classification_report(
            golds, predictions, output_dict=True, zero_division=0, **strict
        )
    figures = {"token_accuracy": accuracy_score(golds, predictions) if any(golds) else 0.0}
    for name, row in report.items():
        if name in ("macro avg", "weighted avg"):
            continue
        prefix = "entity" if name == "micro avg" else name
        for m, key in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score")):
            figures[f"{prefix}_{m}"] = row[key]
    return figures


def clean(tags, scheme):
    """Only the tags `scheme` allows (the edge cases mix them)."""
    return [t if metrics.tag_error(t, scheme) is None else "O" for t in tags]


def random_sentences(rng, scheme, count):
    tags = all_tags(scheme)
    return [[rng.choice(tags) for _ in range(rng.randint(0, 9))] for _ in range(count)]


@pytest.mark.parametrize("mode", metrics.MODES)
@pytest.mark.parametrize("scheme", list(SEQEVAL))
def test_scores_equal_seqeval_on_random_sequences(scheme, mode):
    rng = random.Random(scheme)
    for _ in range(150):
        golds = random_sentences(rng, scheme, 5)
        predictions = [[rng.choice(all_tags(scheme)) for _ in g] for g in golds]
        if not any(golds):
            continue
        want = reference(golds, predictions, scheme, mode)
        got = metrics.score(golds, predictions, scheme, mode)
        assert got == pytest.approx(want), (golds, predictions)


@pytest.mark.parametrize("mode", metrics.MODES)
@pytest.mark.parametrize("scheme", list(SEQEVAL))
@pytest.mark.parametrize("case", range(len(EDGE_CASES)))
def test_scores_equal_seqeval_on_edge_cases(scheme, case, mode):
    sentences = [clean(tags, scheme) for tags in EDGE_CASES[case]]
    nothing = [["O"] * len(s) for s in sentences]
    for golds, predictions in ((sentences, sentences), (sentences, nothing)):
        assert metrics.score(golds, predictions, scheme, mode) == pytest.approx(
            reference(golds, predictions, scheme, mode)
        )


def test_the_modes_differ_only_on_what_the_scheme_forbids():
    ill_formed = ["O", "I-PER", "I-PER", "O"]  # IOB2's I- after O
    assert metrics.entities(ill_formed, "IOB2") == []
    assert metrics.entities(ill_formed, "IOB2", "conlleval") == [("PER", 1, 3)]
    for tags in (["B-PER", "I-PER", "B-PER"], ["O", "B-LOC", "O"]):
        assert metrics.entities(tags, "IOB2") == metrics.entities(tags, "IOB2", "conlleval")


@pytest.mark.parametrize("scheme", list(SEQEVAL))
def test_entities_are_seqevals(scheme):
    rng = random.Random(1)
    sentences = random_sentences(rng, scheme, 300)
    want = Entities(sentences, SEQEVAL[scheme]).entities
    for tags, entities in zip(sentences, want):
        assert metrics.entities(tags, scheme) == [(e.tag, e.start, e.end) for e in entities]


@pytest.mark.parametrize("source", list(SEQEVAL))
@pytest.mark.parametrize("target", list(SEQEVAL))
def test_conversion_keeps_the_entities_seqeval_finds(source, target):
    rng = random.Random(2)
    for tags in random_sentences(rng, source, 200):
        converted = metrics.convert(tags, source, target)
        assert all(metrics.tag_error(t, target) is None for t in converted)
        found = [e.to_tuple()[1:] for e in Entities([converted], SEQEVAL[target]).entities[0]]
        assert found == [e.to_tuple()[1:] for e in Entities([tags], SEQEVAL[source]).entities[0]]


def test_a_tag_outside_the_scheme_is_named():
    assert metrics.tag_error("B-PER", "IOB2") is None
    assert "not a IOB2 tag" in metrics.tag_error("S-PER", "IOB2")
    assert metrics.tag_error("PER", "BIOES") is not None
    assert metrics.tag_error("NN", "none") is None
    with pytest.raises(ValueError, match="not one of"):
        metrics.score([["O"]], [["O"]], "IOB3")
    with pytest.raises(ValueError, match="entity mode 'lenient' is not one of"):
        metrics.score([["O"]], [["O"]], "IOB2", "lenient")
