"""SQuAD files to examples and windows: answers found again through the offsets, bad files
named with their fix."""

import json

import numpy as np
import pytest

from bert_flax.data.tokenization import load_vocab
from bert_flax.tasks.squad import reading

CONTEXT = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to "
    "Normandy, a region in France. They were descended from Norse raiders and pirates from "
    "Denmark, Iceland and Norway who, under their leader Rollo, agreed to swear fealty to King "
    "Charles III of West Francia."
)


@pytest.fixture(scope="module")
def vocab():
    return load_vocab()


def squad_file(tmp_path, qas, context=CONTEXT):
    path = tmp_path / "squad.json"
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}  # fmt: skip
    path.write_text(json.dumps(data))
    return str(path)


def qa(question_id, question, text, impossible=False):
    answers = [] if impossible else [{"text": text, "answer_start": CONTEXT.index(text)}]
    return {"id": question_id, "question": question, "answers": answers,
            "is_impossible": impossible}  # fmt: skip


def test_a_file_reads_as_one_example_per_question(tmp_path):
    path = squad_file(tmp_path, [qa("a", "Who was Rollo?", "their leader Rollo"),
                                 qa("b", "Who founded Rome?", "", impossible=True)])  # fmt: skip
    first, second = reading.read_squad(path)
    assert (first.id, first.answers[0].text, first.is_impossible) == (
        "a",
        "their leader Rollo",
        False,
    )
    assert (second.answers, second.is_impossible) == ((), True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda q: q.pop("question"), r'question .a. has no "question" field'),
        (lambda q: q["answers"][0].update(answer_start=3), r"not at character 3.*answer_start"),
        (lambda q: q.update(answers=[]), r'no answers and is not marked "is_impossible"'),
    ],
)
def test_a_bad_question_is_named_with_its_fix(tmp_path, change, message):
    question = qa("a", "Who was Rollo?", "Rollo")
    change(question)
    with pytest.raises(ValueError, match=message) as error:
        reading.read_squad(squad_file(tmp_path, [question]))
    assert "squad.json" in str(error.value) and "\n" not in str(error.value)


def test_an_empty_context_or_a_non_squad_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="empty context"):
        reading.read_squad(squad_file(tmp_path, [qa("a", "q", "")], context=" "))
    (tmp_path / "other.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match='no "data" list'):
        reading.read_squad(str(tmp_path / "other.json"))


def test_windows_cover_the_context_and_find_the_answer_through_the_offsets(tmp_path, vocab):
    text = "King Charles III of West Francia"
    (example,) = reading.read_squad(squad_file(tmp_path, [qa("a", "To whom?", text)]))
    windows = reading.to_windows(example, vocab, max_seq_length=32, doc_stride=8)
    context = vocab.tokenizer.encode(CONTEXT, add_special_tokens=False)
    assert len(windows) > 3
    seen = set()
    for window in windows:
        assert window.input_ids[0] == vocab.cls_id and window.input_ids[-1] == vocab.sep_id
        assert len(window.input_ids) <= 32
        spans = window.char_spans[window.context_mask]
        # The window's context tokens are a run of the whole context's tokens, in order.
        first = context.offsets.index(tuple(spans[0]))
        piece = window.input_ids[window.context_mask]
        assert list(piece) == context.ids[first : first + len(piece)]
        seen.update(range(first, first + len(piece)))
        assert (window.type_ids == 1).sum() == len(piece) + 1  # the context and its [SEP]
        if window.start:
            found = CONTEXT[window.char_spans[window.start, 0] : window.char_spans[window.end, 1]]
            assert found == text
        else:
            assert window.end == 0  # no answer here: both at [CLS]
    assert seen == set(range(len(context.ids)))
    assert any(w.start for w in windows)


def test_an_impossible_question_is_labelled_at_cls_and_a_row_too_short_is_an_error(tmp_path, vocab):
    (example,) = reading.read_squad(squad_file(tmp_path, [qa("b", "Why?", "", impossible=True)]))
    assert all((w.start, w.end) == (0, 0) for w in reading.to_windows(example, vocab))
    with pytest.raises(ValueError, match=r"no room for a context.*max_query_length"):
        reading.to_windows(example, vocab, max_seq_length=4)
    assert np.all(reading.to_windows(example, vocab)[0].char_spans[:4] == -1)
