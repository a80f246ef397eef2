"""The stages of `create_pretraining_data` run on this machine (``--runner=local``, the default),
beside `beam_pipeline.py`, which runs the same stages on Apache Beam and writes the same bytes.

    metas, counts = run_local(source, vocab, recipe, seed=0, shard_paths=paths,
                              documents_per_bucket=4096, work_dir=work, num_workers=2,
                              progress=False)

Per split, documents are streamed: one bucket of documents is in memory, its examples made on a
pool of forked worker processes, spilled per shard to ``work_dir`` and written shard by shard in
key order (the order a hash of each example's seed gives: the same for any number of workers).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence

import numpy as np
import tqdm
from absl import logging

from bert_flax.data import stages, tokenization
from bert_flax.data.examples import Recipe, RecipeStats

# A shard larger than this is sorted in memory with a warning to raise the number of shards.
LARGE_SHARD_BYTES = 2 * 1024**3

# Worker state of one bucket: set by `_init_worker` (inherited without pickling under fork).
_WORKER: dict = {}


def _init_worker(ordinals, sentences, recipe: Recipe, seed: int, split: str) -> None:
    _WORKER.update(ordinals=ordinals, sentences=sentences, recipe=recipe, seed=seed, split=split)


def _work(tasks: Sequence[tuple[int, int]]) -> tuple[list[stages.KeyedRecord], RecipeStats]:
    """Keyed examples of (dupe pass, document) tasks of the worker's bucket."""
    w = _WORKER
    return stages.task_examples(
        w["ordinals"], w["sentences"], tasks, w["recipe"], seed=w["seed"], split=w["split"]
    )


def examples_in_parallel(
    ordinals: Sequence[int],
    sentences: Sequence[Sequence[np.ndarray]],
    recipe: Recipe,
    *,
    seed: int,
    split: str,
    num_workers: int,
    tasks_per_chunk: int = 8,
) -> Iterator[tuple[list[stages.KeyedRecord], RecipeStats]]:
    """The keyed examples of a prepared bucket (``stages.prepare_bucket``), chunk by chunk of
    (dupe, document) tasks, on a pool of forked workers; the records are the same for any
    ``num_workers``, only the order in which they come differs."""
    tasks = stages.bucket_tasks(recipe.options.dupe_factor, len(sentences))
    chunks = [tasks[i : i + tasks_per_chunk] for i in range(0, len(tasks), tasks_per_chunk)]
    init_args = (ordinals, sentences, recipe, seed, split)
    num_workers = max(1, min(num_workers, len(chunks)))
    if num_workers == 1:
        _init_worker(*init_args)
        yield from map(_work, chunks)
    else:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        with context.Pool(num_workers, initializer=_init_worker, initargs=init_args) as pool:
            yield from pool.imap(_work, chunks)
    _WORKER.clear()


def run_local(
    source: stages.Source,
    vocab: tokenization.Vocab,
    recipe: Recipe,
    *,
    seed: int,
    shard_paths: Sequence[str],
    documents_per_bucket: int,
    work_dir: str,
    num_workers: int,
    progress: bool,
) -> tuple[list[stages.ShardMeta], dict[str, int | float]]:
    """One split through the stages in this process (and a worker pool per bucket): documents
    streamed, one bucket of documents and one shard of examples in memory at a time."""
    split = source.split
    spill = stages.Spill(
        [os.path.join(work_dir, f"{split}-{k:05d}.spill") for k in range(len(shard_paths))]
    )
    counts = stages.empty_counts()
    stats = RecipeStats()
    seconds = {"tokenize_seconds": 0.0, "example_seconds": 0.0}
    bar = tqdm.tqdm(
        total=source.num_documents, desc=f"{split}", unit="doc", disable=not progress, mininterval=2
    )

    def make_examples(bucket: list[stages.TokenizedDocument]) -> None:
        start = time.perf_counter()
        ordinals, sentences = stages.prepare_bucket(bucket, recipe, stats)
        for keyed, chunk_stats in examples_in_parallel(
            ordinals, sentences, recipe, seed=seed, split=split, num_workers=num_workers
        ):
            for record in keyed:
                spill.append(record)
            stats.add(chunk_stats)
        seconds["example_seconds"] += time.perf_counter() - start
        bar.set_postfix(examples=stats.examples, refresh=False)

    bucket: list[stages.TokenizedDocument] = []
    current = 0
    for start, stop in source.units():
        t0 = time.perf_counter()
        documents, unit_counts = stages.tokenize_unit(vocab, list(source.read(start, stop)))
        seconds["tokenize_seconds"] += time.perf_counter() - t0
        counts = stages.add_counts([counts, unit_counts])
        for ordinal, sentences in documents:
            index = stages.bucket_of(ordinal, source.num_documents, documents_per_bucket)
            if index != current and bucket:
                make_examples(bucket)
                bucket = []
            current = index
            bucket.append((ordinal, sentences))
        bar.update(unit_counts["documents"])
    if bucket:
        make_examples(bucket)
    bar.close()
    metas = []
    for shard, path in enumerate(shard_paths):
        if spill.bytes[shard] > LARGE_SHARD_BYTES:
            logging.warning(
                "%s holds %.1f GB, sorted in memory; raise --num_%s_shards to bound memory.",
                path,
                spill.bytes[shard] / 1e9,
                split,
            )
        metas.append(stages.write_shard(path, spill.read_and_remove(shard)))
    rounded = {name: round(value, 3) for name, value in seconds.items()}
    return metas, {**stages.add_counts([counts, stats.as_dict()]), **rounded}
