"""Labelled text for packed fine-tuning, sequence classification and regression: its one record
type (`LabelledSplit`), splits and samples of it, and its tokenized form (`EncodedSplit`).

    data = reading.rotten_tomatoes()     # or reading.read_labelled_files("train.csv", "dev.csv")
    vocab = load_vocab()
    train = encode_split(vocab, data.splits["train"], max_seq_length=128)
    for batch in rows.batches(train, batch_size=32, max_seq_length=128, max_sequences_per_pack=8):
        ...                          # contract.CLASSIFICATION_FEATURES, batch dimension first

Each example becomes ``[CLS] a [SEP]`` (or ``[CLS] a [SEP] b [SEP]`` for sentence pairs, token
types 0/1), cut to ``max_seq_length`` by BERT's longest-first truncation (counted in
``EncodedSplit.truncated``). ``rows.batches`` packs up to D examples a row on the length
histogram (``packing.pack_histogram``) and builds the rows: the core fields of every task, plus
`labels` (class id, or regression target) and `example_ids` (the example's stable id, -1 for an
empty slot) per slot (docs/design.md, "The packed batch"). Padded rows are the same with D = 1.
Files are read and checked by `reading`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bert_flax.data.tokenization import Vocab, encode
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.rows import RowLayout

SPLIT_NAMES = ("train", "validation", "test")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)


def is_labelled(labels: np.ndarray) -> bool:
    """Whether a split's labels are real: an unlabelled split (a test set) has class id -1 or a
    NaN target for every example."""
    unlabelled = np.isnan(labels) if labels.dtype.kind == "f" else labels < 0
    return not np.all(unlabelled)


@dataclasses.dataclass(frozen=True)
class LabelledSplit:
    """Texts (optionally sentence pairs) with their labels and stable example ids."""

    texts: list[str]
    texts_b: list[str] | None
    labels: np.ndarray  # int32 [N] class ids, float32 [N] regression targets; -1, NaN: unlabelled
    ids: np.ndarray  # int32 [N]: the example's row in its source file

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, indices: np.ndarray) -> LabelledSplit:
        """The examples at ``indices``, in that order."""
        return LabelledSplit(
            texts=[self.texts[i] for i in indices],
            texts_b=None if self.texts_b is None else [self.texts_b[i] for i in indices],
            labels=self.labels[indices],
            ids=self.ids[indices],
        )


@dataclasses.dataclass(frozen=True)
class LabelledData:
    """Named splits of one task; ``label_names[i]`` names class id i (None for regression)."""

    splits: dict[str, LabelledSplit]
    label_names: list[str] | None
    source: str

    @property
    def regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        """Outputs of the classifier head: the number of classes, 1 for regression."""
        return 1 if self.label_names is None else len(self.label_names)

    def label_balance(self) -> dict[str, dict[str, float]]:
        """Per split, examples per label name (regression: count, mean and std of the targets)."""
        balance: dict[str, dict[str, float]] = {}
        for name, split in self.splits.items():
            if not is_labelled(split.labels):
                continue
            if self.label_names is None:
                labels = split.labels.astype(np.float64)
                balance[name] = {
                    "count": len(labels),
                    "mean": float(labels.mean()),
                    "std": float(labels.std()),
                }
            else:
                counts = np.bincount(split.labels, minlength=len(self.label_names))
                balance[name] = dict(zip(self.label_names, counts.tolist()))
        return balance

    def majority_baseline(self, split: str = "validation") -> float:
        """Accuracy on ``split`` of always predicting the train split's most frequent label."""
        if self.label_names is None:
            raise ValueError("A regression task has no majority label.")
        majority = np.bincount(self.splits["train"].labels).argmax()
        return float(np.mean(self.splits[split].labels == majority))


def split_indices(
    count: int, seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS
) -> dict[str, np.ndarray]:
    """A seeded random split of ``range(count)`` into train/validation[/test] by ``fractions``
    (two or three, summing to 1); each split's indices are sorted."""
    if len(fractions) not in (2, 3) or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(
            f"fractions={tuple(fractions)} must be 2 or 3 positive numbers summing to 1 "
            "(train, validation[, test])."
        )
    bounds = np.round(np.cumsum([0.0, *fractions]) * count).astype(np.int64)
    bounds[-1] = count
    if np.any(np.diff(bounds) == 0):
        raise ValueError(f"{count} examples leave a split of fractions={tuple(fractions)} empty.")
    order = np.random.default_rng(seed).permutation(count)
    return {
        name: np.sort(order[bounds[i] : bounds[i + 1]])
        for i, name in enumerate(SPLIT_NAMES[: len(fractions)])
    }


def stratified_sample(split: LabelledSplit, count: int, seed: int = 0) -> LabelledSplit:
    """``count`` examples of ``split`` (in its order) with its label shares: each class's
    share of ``count`` rounded by largest remainder, drawn as a prefix of a seeded permutation
    of that class, so a smaller sample is part of every larger one of the same seed; regression
    targets count as one class."""
    if not 0 < count <= len(split):
        raise ValueError(
            f"A sample of {count} training examples: the split has {len(split)}; ask for 1 to "
            f"{len(split)} (0: all of them)."
        )
    labels = split.labels if np.issubdtype(split.labels.dtype, np.integer) else np.zeros(len(split))
    classes, sizes = np.unique(labels, return_counts=True)
    quota = sizes * count / len(split)
    taken = np.floor(quota).astype(np.int64)
    taken[np.argsort(taken - quota, kind="stable")[: count - taken.sum()]] += 1
    rng = np.random.default_rng(seed)
    chosen = [
        rng.permutation(np.flatnonzero(labels == label))[:take]
        for label, take in zip(classes, taken)
    ]
    return split.select(np.sort(np.concatenate(chosen)))


@dataclasses.dataclass(frozen=True)
class EncodedSplit:
    """Tokenized examples, concatenated: example i is ``input_ids[offsets[i]:offsets[i + 1]]``
    (``[CLS] a [SEP] (b [SEP])``, at most ``max_seq_length`` tokens)."""

    input_ids: np.ndarray  # int32 [T]
    token_type_ids: np.ndarray  # int32 [T]
    offsets: np.ndarray  # int64 [N + 1]
    labels: np.ndarray  # int32 or float32 [N]
    ids: np.ndarray  # int32 [N]
    max_seq_length: int
    truncated: int  # examples cut to fit max_seq_length

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example, int64 [N]."""
        return np.diff(self.offsets)

    def tokens(self, example: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = self.offsets[example] + position
        return self.input_ids[flat], self.token_type_ids[flat]

    def task_features(self, layout: RowLayout, shape: RowShape) -> dict[str, np.ndarray]:
        """Labels and stable example ids per slot (`rows.build_rows`)."""
        return {
            "labels": layout.per_slot(self.labels).astype(self.labels.dtype),
            "example_ids": np.where(layout.valid, self.ids[layout.source], -1).astype(np.int32),
        }


def truncated_lengths(
    lengths_a: np.ndarray, lengths_b: np.ndarray | None, budget: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Lengths kept by BERT's longest-first truncation to ``budget`` tokens (pop from the
    longer text, from b on ties), in closed form."""
    if lengths_b is None:
        return np.minimum(lengths_a, budget), None
    a, b = np.asarray(lengths_a, np.int64), np.asarray(lengths_b, np.int64)
    shorter = np.minimum(a, b)
    fits, short_kept = a + b <= budget, shorter <= budget // 2
    # The shorter text survives whole if it takes at most half; else both are halved, a keeping
    # the odd token (ties pop b first).
    keep_a = np.where(
        fits, a, np.where(short_kept, np.where(a <= b, a, budget - b), -(-budget // 2))
    )
    keep_b = np.where(fits, b, np.where(short_kept, np.where(a <= b, budget - a, b), budget // 2))
    return keep_a, keep_b


def encode_split(vocab: Vocab, split: LabelledSplit, max_seq_length: int) -> EncodedSplit:
    """Tokenize a split into ``[CLS] a [SEP] (b [SEP])`` of at most ``max_seq_length`` tokens."""
    specials = 2 if split.texts_b is None else 3
    if max_seq_length <= specials:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text.")
    tokens_a = encode(vocab, split.texts)
    tokens_b = None if split.texts_b is None else encode(vocab, split.texts_b)
    raw_a = np.array([len(t) for t in tokens_a], dtype=np.int64)
    raw_b = None if tokens_b is None else np.array([len(t) for t in tokens_b], dtype=np.int64)
    keep_a, keep_b = truncated_lengths(raw_a, raw_b, max_seq_length - specials)
    truncated = keep_a < raw_a if raw_b is None else (keep_a < raw_a) | (keep_b < raw_b)
    cls = np.array([vocab.cls_id], dtype=np.int32)
    sep = np.array([vocab.sep_id], dtype=np.int32)
    ids, types = [], []
    for i, a in enumerate(tokens_a):
        first = np.concatenate([cls, a[: keep_a[i]], sep])
        ids.append(first)
        types.append(np.zeros(len(first), np.int32))
        if tokens_b is not None:
            second = np.concatenate([tokens_b[i][: keep_b[i]], sep])
            ids.append(second)
            types.append(np.ones(len(second), np.int32))
    lengths = keep_a + specials + (0 if keep_b is None else keep_b)
    return EncodedSplit(
        input_ids=np.concatenate(ids) if ids else np.zeros(0, np.int32),
        token_type_ids=np.concatenate(types) if types else np.zeros(0, np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        labels=split.labels,
        ids=split.ids,
        max_seq_length=max_seq_length,
        truncated=int(truncated.sum()),
    )
