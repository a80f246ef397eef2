"""SQuAD v1.1 and v2.0 files: questions over contexts, answers as character spans.

    examples = read_squad("train-v1.1.json")     # one `Example` per question
    windows = to_windows(examples[0], vocab)      # its (question, context window) sequences

A context longer than the row is split into windows of `max_seq_length` tokens
([CLS] question [SEP] context piece [SEP]) that start every `doc_stride` context tokens, the
question cut to `max_query_length` tokens (as google-research/bert's `run_squad.py`). Each window
keeps, for each of its context tokens, the character span it came from (the fast tokenizer's
offsets), so a predicted token span maps back to the context's own text; a training answer
outside a window is labelled there as no answer, at [CLS] (position 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from bert_flax.data.tokenization import Vocab


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset in the context


@dataclasses.dataclass(frozen=True)
class Example:
    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]  # empty when impossible
    is_impossible: bool = False


def read_squad(path: str) -> list[Example]:
    """Every question of a SQuAD JSON file, its answers checked against their contexts."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist; give a SQuAD v1.1 or v2.0 JSON file.")
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not JSON ({e}); give a SQuAD v1.1 or v2.0 file.") from e
    return parse_squad(data, path)


def parse_squad(data: Any, path: str) -> list[Example]:
    """The questions of a SQuAD file's parsed JSON (`path` names it in errors)."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f'{path}: no "data" list at the top; is it a SQuAD file?')
    return [
        _example(path, paragraph, qa)
        for article in data["data"]
        for paragraph in _field(path, "an article", article, "paragraphs")
        for qa in _field(path, "a paragraph", paragraph, "qas")
    ]


def _field(path: str, where: str, record: dict, key: str):
    if key not in record:
        raise ValueError(f'{path}: {where} has no "{key}" field; every SQuAD {where} needs one.')
    return record[key]


def _example(path: str, paragraph: dict, qa: dict) -> Example:
    context = _field(path, "a paragraph", paragraph, "context")
    question_id = str(_field(path, "a question", qa, "id"))
    where = f"question {question_id!r}"
    if not context.strip():
        raise ValueError(f"{path}: {where} has an empty context; drop it or fill it in.")
    question = _field(path, where, qa, "question")
    impossible = bool(qa.get("is_impossible", False))
    answers = []
    for answer in [] if impossible else _field(path, where, qa, "answers"):
        text = _field(path, where, answer, "text")
        start = _field(path, where, answer, "answer_start")
        if context[start : start + len(text)] != text:
            raise ValueError(
                f"{path}: {where}: answer {text!r} is not at character {start} of its context "
                f"(found {context[start : start + len(text)]!r}); fix its answer_start."
            )
        answers.append(Answer(text, start))
    if not impossible and not answers:
        raise ValueError(f'{path}: {where} has no answers and is not marked "is_impossible".')
    return Example(question_id, question, context, tuple(answers), impossible)


@dataclasses.dataclass(frozen=True)
class Window:
    """One (question, context window) sequence of an example."""

    example_id: str
    input_ids: np.ndarray  # int32 [tokens]: [CLS] question [SEP] context piece [SEP]
    type_ids: np.ndarray  # int32 [tokens]: 0 for [CLS] question [SEP], 1 after
    char_spans: np.ndarray  # int32 [tokens, 2]: a context token's characters; -1 elsewhere
    start: int  # the answer's first and last token, 0 (at [CLS]) when not in this window
    end: int

    @property
    def context_mask(self) -> np.ndarray:
        """bool [tokens]: the tokens an answer may start or end at."""
        return self.char_spans[:, 0] >= 0


def to_windows(
    example: Example,
    vocab: Vocab,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> list[Window]:
    """The example's windows (the first answer labels them, as in training)."""
    question = vocab.tokenizer.encode(example.question, add_special_tokens=False).ids
    question = question[:max_query_length]
    context = vocab.tokenizer.encode(example.context, add_special_tokens=False)
    room = max_seq_length - len(question) - 3
    if room <= 0:
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for a context after a question of "
            f"{len(question)} tokens; raise it or lower max_query_length={max_query_length}."
        )
    spans = np.asarray(context.offsets, np.int32).reshape(-1, 2)
    answer = _token_span(example, spans)
    windows, first = [], 0
    while True:
        piece = slice(first, min(first + room, len(context.ids)))
        windows.append(_window(example.id, question, context.ids[piece], spans[piece], first,
                               answer, vocab))  # fmt: skip
        if piece.stop >= len(context.ids):
            return windows
        first += min(doc_stride, room)


def _token_span(example: Example, spans: np.ndarray) -> tuple[int, int] | None:
    """The context tokens of the first answer (the tokens its characters overlap)."""
    if not example.answers:
        return None
    answer = example.answers[0]
    end_char = answer.start + len(answer.text)
    covered = np.flatnonzero((spans[:, 0] < end_char) & (spans[:, 1] > answer.start))
    return (int(covered[0]), int(covered[-1])) if covered.size else None


def _window(example_id, question, ids, spans, first, answer, vocab: Vocab) -> Window:
    offset = len(question) + 2  # [CLS] question [SEP]
    input_ids = [vocab.cls_id, *question, vocab.sep_id, *ids, vocab.sep_id]
    char_spans = np.full((len(input_ids), 2), -1, np.int32)
    char_spans[offset : offset + len(ids)] = spans
    type_ids = np.zeros(len(input_ids), np.int32)
    type_ids[offset:] = 1
    start = end = 0
    if answer is not None and first <= answer[0] and answer[1] < first + len(ids):
        start, end = answer[0] - first + offset, answer[1] - first + offset
    return Window(example_id, np.asarray(input_ids, np.int32), type_ids, char_spans, start, end)
