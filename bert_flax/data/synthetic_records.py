"""A prepared data directory of synthetic examples, at any scale, for pipeline benchmarks.

    write_data_dir("/tmp/synthetic_1m", num_examples=1_000_000, max_seq_length=512)

Lengths follow ``packing.synthetic.corpus_like_histogram`` (smooth dense bins, 37% at a quarter
of max_seq_length or less, 23% at max_seq_length); token ids are random, 15% of each example
masked. The directory has everything ``create_pretraining_data`` writes for the train split
(shards, record index, histogram, NNLSHP strategies, summary), so every pipeline mode reads it
like real data.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

import packing
from bert_flax.data.examples import default_max_predictions
from bert_flax.input_pipeline import record_index, records
from bert_flax.input_pipeline.contract import Example
from bert_flax.input_pipeline.synthetic import CLS_ID, FIRST_WORD_ID, MASK_ID, SEP_ID

VOCAB_SIZE = 30522


def write_data_dir(
    out_dir: str,
    num_examples: int,
    max_seq_length: int,
    *,
    num_shards: int = 16,
    seed: int = 0,
    chunk: int = 65536,
) -> dict:
    """Writes the directory, generating and writing ``chunk`` examples at a time (per record
    only its length, size and prediction count are kept); returns the summary."""
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    histogram = packing.synthetic.corpus_like_histogram(num_examples, max_seq_length, seed)
    lengths = np.repeat(np.arange(max_seq_length + 1), histogram)
    rng.shuffle(lengths)
    max_predictions = default_max_predictions(max_seq_length)
    paths = records.shard_paths(out_dir, "train", num_shards)
    sizes: list[list[int]] = [[] for _ in paths]
    by_shard: list[list[tuple[int, int]]] = [[] for _ in paths]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    try:
        for start in range(0, num_examples, chunk):
            batch = lengths[start : start + chunk]
            ids = rng.integers(FIRST_WORD_ID, VOCAB_SIZE, size=(len(batch), max_seq_length))
            for k, n in enumerate(batch.tolist()):
                i = start + k
                example = _example(ids[k, :n], n, max_predictions, rng)
                payload = records.serialize(example)
                writers[i % num_shards].write(payload)
                sizes[i % num_shards].append(len(payload))
                by_shard[i % num_shards].append((n, len(example.masked_lm_positions)))
    finally:
        for writer in writers:
            writer.close()
    in_file_order = np.asarray([pair for shard in by_shard for pair in shard]).reshape(-1, 2)
    index = record_index.RecordIndex.from_sizes(
        paths, sizes, in_file_order[:, 0], in_file_order[:, 1]
    )
    index.save(record_index.index_path(out_dir, "train"))
    packing.save_histogram(histogram, os.path.join(out_dir, "histogram.txt"))
    strategies = packing.pack_histogram(histogram, max_seq_length, "nnlshp", 3)
    strategies.save(os.path.join(out_dir, "strategies.json"))
    summary = {
        "input": f"synthetic corpus_like_histogram({num_examples}, {max_seq_length}, {seed})",
        "vocab": {"size": VOCAB_SIZE, "special_ids": {"cls": CLS_ID, "sep": SEP_ID}},
        "options": {
            "max_seq_length": max_seq_length,
            "max_predictions_per_seq": max_predictions,
            "masked_lm_prob": 0.15,
        },
        "splits": {"train": {"examples_per_shard": [len(s) for s in sizes]}},
        "strategies": {"efficiency": float(strategies.metrics().efficiency)},
    }
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _example(words: np.ndarray, n: int, max_predictions: int, rng) -> Example:
    """[CLS] A [SEP] B [SEP] of random words, the halves at a random point, 15% masked."""
    input_ids = words.astype(np.int32)
    input_ids[0] = CLS_ID
    split = int(rng.integers(1, max(2, n - 1))) if n > 3 else 1
    input_ids[min(split, n - 1)] = SEP_ID
    input_ids[n - 1] = SEP_ID
    token_type_ids = np.zeros(n, np.int32)
    token_type_ids[min(split, n - 1) + 1 :] = 1
    candidates = np.flatnonzero(input_ids >= FIRST_WORD_ID)
    count = min(max_predictions, len(candidates), max(1, round(0.15 * n)))
    positions = np.sort(rng.choice(candidates, count, replace=False)) if count else candidates[:0]
    masked_ids = input_ids[positions].copy()
    input_ids[positions] = MASK_ID
    return Example(input_ids, token_type_ids, positions.astype(np.int32), masked_ids, int(n % 2))
