"""The stages of ``create_pretraining_data``, each a pure function of its inputs, so that the
local runner (one process and a worker pool) and the Apache Beam pipeline (``beam_pipeline.py``)
write the same bytes.

    documents (a prepared TFDS split, or one side of a split carved in two, read by slices of
    READ_UNIT_DOCUMENTS)
      -> tokenized documents, each with its ordinal in the split
      -> buckets of consecutive documents (``bucket_of``): NSP draws its random next sentence
         from another document of the same bucket, so a worker holds one bucket, never the corpus
      -> examples, each with a 64-bit key hashed from (seed, split, dupe pass, document, index)
      -> shard ``key % num_shards``, records in key order: a global shuffle that needs one shard
         in memory, not the split

Google BERT's script draws the random next document from all documents it was given, and was
run on one input shard at a time; a bucket plays the role of such a shard.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import struct
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from bert_flax.data import corpus, tokenization
from bert_flax.data.examples import (
    ExampleOptions,
    Recipe,
    RecipeStats,
    document_rng,
    examples_from_document,
    split_long_sentences,
)
from bert_flax.input_pipeline import records

DEFAULT_DOCUMENTS_PER_BUCKET = 10_000
READ_UNIT_DOCUMENTS = 1_000

TokenizedDocument = tuple[int, list[np.ndarray]]  # (ordinal in the split, sentences)


@dataclasses.dataclass(frozen=True)
class KeyedRecord:
    """A serialized example with its shuffle key, tokens and masked positions."""

    key: int
    serialized: bytes
    length: int
    num_predictions: int


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A prepared TFDS dataset of documents: a registered one by ``name`` in the TFDS data dir
    ``data_dir`` (``wikipedia/20230601.en``), else the dataset in directory ``data_dir`` (a
    folder's ``TextFolder``); the documents' text is feature ``text_feature``."""

    data_dir: str
    name: str = ""
    text_feature: str = "text"

    def texts(self, split: str, start: int, stop: int) -> Iterator[str]:
        """The texts of documents ``start..stop-1`` of ``split``, in the prepared order."""
        import tensorflow_datasets as tfds

        if self.name:
            builder = tfds.builder(self.name, data_dir=self.data_dir)
        else:
            builder = tfds.builder_from_directory(self.data_dir)
        dataset = builder.as_dataset(split=f"{split}[{start}:{stop}]", shuffle_files=False)
        for item in tfds.as_numpy(dataset):
            yield item[self.text_feature].decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class Carve:
    """One side of a whole TFDS split cut in two by ``corpus``'s split rule (the rule folders
    are split by; a document's id is its text): the documents whose ``split_key`` is below
    ``threshold`` (validation), or the others (train)."""

    split: str  # the TFDS split carved
    num_read: int  # its documents
    threshold: int
    validation: bool
    starts: tuple[int, ...]  # per read unit of the split, the ordinal of its first document here

    def takes(self, text: str) -> bool:
        return (corpus.split_key(text) < self.threshold) == self.validation


@dataclasses.dataclass(frozen=True)
class Source:
    """One split of documents, read by slices: a split of ``dataset``, or with ``carve`` one side
    of a split carved in two (slices then index the carved split, ordinals this side)."""

    dataset: Dataset
    split: str  # the split written ("train", "validation")
    num_documents: int
    carve: Carve | None = None

    def units(self, size: int = READ_UNIT_DOCUMENTS) -> list[tuple[int, int]]:
        """(start, stop) slices covering what is read, in order."""
        total = self.carve.num_read if self.carve else self.num_documents
        return [(a, min(a + size, total)) for a in range(0, total, size)]

    def read(self, start: int, stop: int) -> Iterator[tuple[int, list[str]]]:
        """(ordinal, paragraphs) of the documents of slice ``start..stop-1``."""
        if self.carve is None:
            texts = self.dataset.texts(self.split, start, stop)
            for ordinal, text in enumerate(texts, start):
                yield ordinal, _paragraphs(text)
            return
        first = start - start % READ_UNIT_DOCUMENTS  # a unit's start: its first ordinal is known
        ordinal = self.carve.starts[first // READ_UNIT_DOCUMENTS]
        for index, text in enumerate(self.dataset.texts(self.carve.split, first, stop), first):
            if self.carve.takes(text):
                if index >= start:
                    yield ordinal, _paragraphs(text)
                ordinal += 1


def _paragraphs(text: str) -> list[str]:
    return [line.strip() for line in text.split("\n") if line.strip()]


def carve(source: Source, validation_fraction: float) -> dict[str, Source]:
    """``source``, a whole split, as train and validation by the split rule folders are split by
    (``corpus.validation_threshold`` of the documents' ``split_key``, a document's id being its
    text): one pass over the split for the keys (8 bytes a document)."""
    units = source.units()
    keys = [
        np.fromiter(map(corpus.split_key, source.dataset.texts(source.split, *u)), np.uint64)
        for u in units
    ]
    threshold = corpus.validation_threshold(np.concatenate(keys), validation_fraction)
    in_validation = np.asarray([int(np.sum(k < threshold)) for k in keys], np.int64)
    in_train = np.asarray([len(k) for k in keys], np.int64) - in_validation
    sides = {}
    for name, counts in (("train", in_train), ("validation", in_validation)):
        starts = tuple(int(s) for s in np.cumsum(counts) - counts)
        cut = Carve(source.split, source.num_documents, threshold, name == "validation", starts)
        sides[name] = Source(source.dataset, name, int(counts.sum()), cut)
    return sides


def make_recipe(vocab: tokenization.Vocab, options: ExampleOptions) -> Recipe:
    """The recipe with what it needs of ``vocab``."""
    return Recipe(
        options=options,
        cls_id=vocab.cls_id,
        sep_id=vocab.sep_id,
        mask_id=vocab.mask_id,
        is_continuation=vocab.is_continuation,
        replacement_ids=vocab.replacement_ids,
    )


def tokenize_unit(
    vocab: tokenization.Vocab, documents: Sequence[tuple[int, list[str]]]
) -> tuple[list[TokenizedDocument], dict[str, int]]:
    """Tokenized documents with tokens, and counts (documents, without tokens, sentences)."""
    tokenized = tokenization.tokenize_documents(vocab, [paragraphs for _, paragraphs in documents])
    kept = [(ordinal, doc) for (ordinal, _), doc in zip(documents, tokenized) if doc]
    counts = {
        "documents": len(documents),
        "documents_without_tokens": len(documents) - len(kept),
        "sentences": sum(len(doc) for _, doc in kept),
    }
    return kept, counts


def check_documents_per_bucket(documents_per_bucket: int) -> None:
    """NSP needs another document to draw from: a clear error for buckets of fewer than two."""
    if documents_per_bucket < 2:
        raise ValueError(f"documents_per_bucket must be >= 2, got {documents_per_bucket}.")


def bucket_of(ordinal: int, num_documents: int, documents_per_bucket: int) -> int:
    """Bucket of the ``ordinal``-th document: consecutive runs of ``documents_per_bucket``, the
    remainder joining the last (so every bucket of a split with more documents than one bucket
    has between documents_per_bucket and 2 * documents_per_bucket - 1)."""
    check_documents_per_bucket(documents_per_bucket)
    num_buckets = max(1, num_documents // documents_per_bucket)
    return min(ordinal // documents_per_bucket, num_buckets - 1)


def example_key(seed: int, split: str, dupe: int, ordinal: int, index: int) -> int:
    """The shuffle key of the ``index``-th example of a (dupe pass, document): 64 bits of a
    hash, so the order is a function of the seed alone."""
    text = f"{seed}:{split}:{dupe}:{ordinal}:{index}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def prepare_bucket(
    documents: Iterable[TokenizedDocument], recipe: Recipe, stats: RecipeStats
) -> tuple[list[int], list[list[np.ndarray]]]:
    """A bucket's documents in ordinal order, over-long sentences split (counted in ``stats``)."""
    ordered = sorted(documents, key=lambda item: item[0])
    max_tokens = recipe.options.max_seq_length - 3
    sentences = [
        split_long_sentences(doc, max_tokens, recipe.is_continuation, stats) for _, doc in ordered
    ]
    return [ordinal for ordinal, _ in ordered], sentences


def document_examples(
    ordinals: Sequence[int],
    documents: Sequence[Sequence[np.ndarray]],
    index: int,
    dupe: int,
    recipe: Recipe,
    *,
    seed: int,
    split: str,
    stats: RecipeStats,
) -> list[KeyedRecord]:
    """The keyed examples of the ``index``-th document of a prepared bucket in one dupe pass."""
    ordinal = ordinals[index]
    rng = document_rng(seed, split, dupe, ordinal)
    return [
        KeyedRecord(
            key=example_key(seed, split, dupe, ordinal, k),
            serialized=records.serialize(example),
            length=len(example.input_ids),
            num_predictions=len(example.masked_lm_positions),
        )
        for k, example in enumerate(examples_from_document(documents, index, rng, recipe, stats))
    ]


def bucket_tasks(dupe_factor: int, num_documents: int) -> list[tuple[int, int]]:
    """The (dupe pass, document index) tasks of a prepared bucket, in order."""
    return [(dupe, d) for dupe in range(dupe_factor) for d in range(num_documents)]


def task_examples(
    ordinals: Sequence[int],
    documents: Sequence[Sequence[np.ndarray]],
    tasks: Iterable[tuple[int, int]],
    recipe: Recipe,
    *,
    seed: int,
    split: str,
) -> tuple[list[KeyedRecord], RecipeStats]:
    """The keyed examples of (dupe pass, document index) tasks of a prepared bucket."""
    stats = RecipeStats()
    keyed = [
        record
        for dupe, index in tasks
        for record in document_examples(
            ordinals, documents, index, dupe, recipe, seed=seed, split=split, stats=stats
        )
    ]
    return keyed, stats


def bucket_examples(
    documents: Iterable[TokenizedDocument], recipe: Recipe, *, seed: int, split: str
) -> tuple[list[KeyedRecord], RecipeStats]:
    """All keyed examples of a bucket, every dupe pass, in one process."""
    stats = RecipeStats()
    ordinals, sentences = prepare_bucket(documents, recipe, stats)
    tasks = bucket_tasks(recipe.options.dupe_factor, len(sentences))
    keyed, task_stats = task_examples(ordinals, sentences, tasks, recipe, seed=seed, split=split)
    stats.add(task_stats)
    return keyed, stats


@dataclasses.dataclass
class ShardMeta:
    """What the index and the summary need of a written shard: record sizes, lengths and
    masked positions, in file order."""

    sizes: np.ndarray
    lengths: np.ndarray
    num_predictions: np.ndarray

    def save(self, path: str) -> None:
        buffer = io.BytesIO()
        np.savez(
            buffer, sizes=self.sizes, lengths=self.lengths, num_predictions=self.num_predictions
        )
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(buffer.getvalue())

    @classmethod
    def load(cls, path: str) -> ShardMeta:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = np.load(io.BytesIO(f.read()))
        return cls(data["sizes"], data["lengths"], data["num_predictions"])

    @classmethod
    def empty(cls) -> ShardMeta:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int16))


def write_shard(path: str, keyed: Iterable[KeyedRecord]) -> ShardMeta:
    """Write ``keyed`` to ``path`` in key order (ties, which a 64-bit hash makes improbable,
    broken by the bytes) and describe what was written."""
    ordered = sorted(keyed, key=lambda r: (r.key, r.serialized))
    with tf.io.TFRecordWriter(path) as writer:
        for record in ordered:
            writer.write(record.serialized)
    return ShardMeta(
        sizes=np.asarray([len(r.serialized) for r in ordered], np.int64),
        lengths=np.asarray([r.length for r in ordered], np.int32),
        num_predictions=np.asarray([r.num_predictions for r in ordered], np.int16),
    )


def meta_path(work_dir: str, split: str, shard: int) -> str:
    return os.path.join(work_dir, f"{split}-{shard:05d}.meta.npz")


def counts_path(work_dir: str, split: str) -> str:
    return os.path.join(work_dir, f"{split}-counts.json")


def save_counts(path: str, counts: dict[str, int]) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        json.dump(counts, f)


def load_counts(path: str) -> dict[str, int]:
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def empty_counts() -> dict[str, int]:
    """Every count a split reports (``tokenize_unit``'s and the recipe's), at zero."""
    return {
        "documents": 0,
        "documents_without_tokens": 0,
        "sentences": 0,
        **RecipeStats().as_dict(),
    }


def add_counts(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for name, value in part.items():
            total[name] = total.get(name, 0) + value
    return total


class Spill:
    """The local runner's external shuffle: each shard's keyed records on local disk, appended
    as they are made (buffered in memory up to ``buffer_bytes`` in all, so a thousand shards
    need neither a thousand open files nor a buffer each), read back one shard at a time."""

    _HEADER = struct.Struct("<QIIH")  # key, payload bytes, length, masked positions

    def __init__(self, paths: Sequence[str], buffer_bytes: int = 64 * 1024**2):
        self.paths = list(paths)
        self.bytes = [0] * len(self.paths)  # spilled per shard, buffered included
        self._buffers: list[list[bytes]] = [[] for _ in self.paths]
        self._buffered = 0
        self._buffer_bytes = buffer_bytes
        for path in self.paths:
            open(path, "wb").close()

    def append(self, record: KeyedRecord) -> None:
        shard = record.key % len(self.paths)
        header = self._HEADER.pack(
            record.key, len(record.serialized), record.length, record.num_predictions
        )
        self._buffers[shard] += [header, record.serialized]
        size = len(header) + len(record.serialized)
        self.bytes[shard] += size
        self._buffered += size
        if self._buffered > self._buffer_bytes:
            self._flush()

    def _flush(self) -> None:
        for path, buffer in zip(self.paths, self._buffers):
            if buffer:
                with open(path, "ab") as f:
                    f.write(b"".join(buffer))
                buffer.clear()
        self._buffered = 0

    def read_and_remove(self, shard: int) -> list[KeyedRecord]:
        """The shard's records in the order they were appended; its file is removed."""
        self._flush()
        with open(self.paths[shard], "rb") as f:
            data = f.read()
        os.remove(self.paths[shard])
        keyed, position, size = [], 0, self._HEADER.size
        while position < len(data):
            key, length, tokens, predictions = self._HEADER.unpack_from(data, position)
            position += size
            keyed.append(KeyedRecord(key, data[position : position + length], tokens, predictions))
            position += length
        return keyed
