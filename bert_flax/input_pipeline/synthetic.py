"""Random batches of the packed-batch contract (`bert_flax.input_pipeline.contract`), without
TensorFlow.

For benchmarks, the profiler and tests: any per-row list of sequence lengths becomes a valid
packed batch (random WordPiece ids, [CLS]/[SEP] markers, 15% masked positions, NSP labels). A
padded batch is the same with one sequence per row (D = 1):

    shape = RowShape(128, 3, 22)
    batch = random_batch(32, shape, vocab_size=30522, seed=0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bert_flax.input_pipeline.contract import PRETRAINING_FEATURES, RowShape, feature_dtype

CLS_ID, SEP_ID, MASK_ID = 101, 102, 103
FIRST_WORD_ID = 999  # bert-base-uncased: ids below are [PAD], [unused*], [UNK], [CLS], [SEP], ...
MASKED_LM_PROB = 0.15


def batch_from_lengths(
    row_lengths: Sequence[Sequence[int]],
    shape: RowShape,
    *,
    vocab_size: int = 30522,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A batch whose row i packs sequences of lengths `row_lengths[i]` (each at least 2)."""
    rng = np.random.default_rng(seed)
    rows, L, D = len(row_lengths), shape.max_seq_length, shape.max_sequences_per_pack
    P = shape.max_predictions_per_pack
    if vocab_size <= MASK_ID + 1:
        raise ValueError(f"vocab_size={vocab_size} leaves no ids after the special ones.")
    first_word = FIRST_WORD_ID if vocab_size > 2 * FIRST_WORD_ID else MASK_ID + 1
    batch = {
        name: np.zeros((rows, *shape.feature_shape(name)), feature_dtype(name))
        for name in PRETRAINING_FEATURES
    }
    for r, lengths in enumerate(row_lengths):
        if len(lengths) > D or sum(lengths) > L or min(lengths, default=2) < 2:
            raise ValueError(
                f"Row {r} lengths {tuple(lengths)} do not fit max_seq_length={L}, "
                f"max_sequences_per_pack={D} (each sequence needs at least 2 tokens)."
            )
        start, candidates = 0, []
        for k, n in enumerate(lengths):
            span = slice(start, start + n)
            ids = rng.integers(first_word, vocab_size, n, dtype=np.int32)
            ids[0], ids[-1] = CLS_ID, SEP_ID
            batch["input_ids"][r, span] = ids
            batch["token_type_ids"][r, start + n // 2 : start + n] = 1
            batch["segment_ids"][r, span] = k + 1
            batch["positions"][r, span] = np.arange(n)
            batch["cls_positions"][r, k] = start
            batch["next_sentence_labels"][r, k] = rng.integers(0, 2)
            batch["sequence_mask"][r, k] = 1.0
            words = np.arange(start + 1, start + n - 1)
            count = min(len(words), max(1, round(MASKED_LM_PROB * n)))
            candidates.extend(rng.choice(words, count, replace=False).tolist() if count else [])
            start += n
        picked = np.sort(np.asarray(candidates[:P], np.int32))
        m = len(picked)
        batch["masked_lm_positions"][r, :m] = picked
        batch["masked_lm_ids"][r, :m] = batch["input_ids"][r, picked]
        batch["masked_lm_weights"][r, :m] = 1.0
        batch["input_ids"][r, picked] = MASK_ID
    return batch


def random_row_lengths(
    rows: int, max_seq_length: int, max_sequences_per_pack: int, seed: int = 0
) -> list[list[int]]:
    """Per row, 1..D sequences with random lengths that together fill most of the row."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        k = int(rng.integers(1, max_sequences_per_pack + 1))
        budget = int(rng.integers(max(2 * k, max_seq_length // 2), max_seq_length + 1))
        cuts = np.sort(rng.choice(np.arange(1, budget // 2), k - 1, replace=False)) * 2
        out.append(np.diff(np.concatenate([[0], cuts, [budget]])).tolist())
    return out


def random_batch(
    rows: int, shape: RowShape, *, vocab_size: int = 30522, seed: int = 0
) -> dict[str, np.ndarray]:
    """A random packed batch (D = 1 gives a padded one)."""
    lengths = random_row_lengths(rows, shape.max_seq_length, shape.max_sequences_per_pack, seed)
    return batch_from_lengths(lengths, shape, vocab_size=vocab_size, seed=seed + 1)
