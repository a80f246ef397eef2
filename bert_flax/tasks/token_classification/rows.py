"""Sentences of words into rows of the packed-batch contract
(`bert_flax.input_pipeline.rows.build_rows`):
each sentence `[CLS] sub-words [SEP]`, several a row.

    table = SentenceTable.build(sentences, vocab, label_ids, max_seq_length=128)
    batch = build_rows(table, [[0, 1, 2]], RowShape(128, 16))

Each word becomes its WordPiece sub-words; a sentence longer than the row keeps its first words
that fit (`truncated` counts the sentences cut). Beyond the core fields a row holds per token
`token_labels` (the word's label id on its first sub-word, or on every sub-word with
`label_all_subwords`; -1 elsewhere), `label_mask` (1 where `token_labels` is a label) and
`word_starts` (1 on each word's first sub-word: where its prediction is read), and per slot
`sentence_ids` (the sentence's index, -1 for an empty slot).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import numpy as np

from bert_flax.data import tokenization
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.rows import RowLayout
from bert_flax.tasks.token_classification.reading import Sentence

TOKEN_TASK_FEATURES = ("token_labels", "label_mask", "word_starts", "sentence_ids")
IGNORED = -1


@dataclasses.dataclass
class SentenceTable:
    """The `rows.Examples` table of a list of sentences, flat over their tokens."""

    lengths: np.ndarray  # [N] tokens per sentence, [CLS] and [SEP] included
    ids: np.ndarray  # [T] token ids of every sentence, one after another
    labels: np.ndarray  # [T] label id per token, IGNORED where none
    starts: np.ndarray  # [T] 1 on a word's first sub-word
    word_offsets: list[np.ndarray]  # per sentence: its kept words' first sub-words
    truncated: int  # sentences cut to fit

    @classmethod
    def build(
        cls,
        sentences: Sequence[Sentence],
        vocab: tokenization.Vocab,
        label_ids: Mapping[str, int],
        max_seq_length: int,
        label_all_subwords: bool = False,
    ) -> SentenceTable:
        """The table of `sentences` (labels by `label_ids`; unlabelled ones get none)."""
        if not sentences:
            raise ValueError("There are no sentences to make rows of.")
        pieces = iter(tokenization.encode(vocab, [w for s in sentences for w in s.words]))
        parts, lengths, offsets, truncated = [], [], [], 0
        for sentence in sentences:
            words = [next(pieces) for _ in sentence.words]
            words = [w if w.size else np.array([vocab.unk_id], np.int32) for w in words]
            sizes = np.array([w.size for w in words])
            kept = int(np.searchsorted(np.cumsum(sizes), max_seq_length - 2, side="right"))
            truncated += kept < len(words)
            labels = [label_ids[x] for x in sentence.labels] if sentence.labels else None
            ids, token_labels, starts = _encode(words[:kept], labels, vocab, label_all_subwords)
            parts.append((ids, token_labels, starts))
            lengths.append(ids.size)
            offsets.append(np.flatnonzero(starts))
        ids, token_labels, starts = (np.concatenate(p) for p in zip(*parts))
        return cls(np.array(lengths), ids, token_labels, starts, offsets, truncated)

    @functools.cached_property
    def first(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def tokens(self, example: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = self.first[example] + position
        return self.ids[flat], np.zeros_like(flat)

    def task_features(self, layout: RowLayout, shape: RowShape) -> dict[str, np.ndarray]:
        _, example, position, real = layout.spread(
            layout.per_slot(self.lengths), shape.max_seq_length
        )
        flat = self.first[example] + position
        labels = np.where(real, self.labels[flat], IGNORED)
        return {
            "token_labels": labels.astype(np.int32),
            "label_mask": (labels != IGNORED).astype(np.int32),
            "word_starts": (real & (self.starts[flat] > 0)).astype(np.int32),
            "sentence_ids": np.where(layout.valid, layout.source, -1).astype(np.int32),
        }


def _encode(
    words: list[np.ndarray],
    labels: list[int] | None,
    vocab: tokenization.Vocab,
    label_all_subwords: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, label per token, first-sub-word marks) of `[CLS] words [SEP]`."""
    ids = [np.array([vocab.cls_id], np.int32), *words, np.array([vocab.sep_id], np.int32)]
    token_labels = [np.array([IGNORED])]
    starts = [np.zeros(1, np.int8)]
    for k, word in enumerate(words):
        label = IGNORED if labels is None else labels[k]
        rest = label if label_all_subwords else IGNORED
        token_labels.append(np.array([label] + [rest] * (word.size - 1)))
        starts.append((np.arange(word.size) == 0).astype(np.int8))
    token_labels.append(np.array([IGNORED]))
    starts.append(np.zeros(1, np.int8))
    return np.concatenate(ids), np.concatenate(token_labels), np.concatenate(starts)
