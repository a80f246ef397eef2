"""Batches for the train loop: this process's rows of each global batch, as numpy.

Real data comes from `bert_flax.data.pipeline.packed_dataset` (packed, or padded with
`config.data.packed=False`); `config.data.synthetic` gives random packed batches instead. Every
process reads its own shard (`process_index`/`process_count`) and yields
`global_rows / process_count` rows; `sharding.global_batch` assembles the global array. Iterators
start at a given position (batches already consumed), computed rather than replayed, which is how
a resumed run continues with the data it has not seen yet.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import jax
import ml_collections
import numpy as np

from bert_flax.data import synthetic
from bert_flax.data.contract import RowShape

Batch = dict[str, np.ndarray]


def local_rows(global_rows: int) -> int:
    return global_rows // jax.process_count()


def synthetic_iterator(
    config: ml_collections.ConfigDict,
    rows: int,
    shape: RowShape,
    vocab_size: int,
    *,
    start: int = 0,
    salt: int = 0,
) -> Iterator[Batch]:
    """Random packed batches; batch i depends only on (seed, salt, i, process)."""
    for index in itertools.count(start):
        key = [config.seed, salt, index, jax.process_index()]
        seed = int(np.random.SeedSequence(key).generate_state(1)[0])
        yield synthetic.random_batch(local_rows(rows), shape, vocab_size=vocab_size, seed=seed)


def eval_packed(config: ml_collections.ConfigDict) -> bool:
    """Whether evaluation rows are packed: as training's, unless `config.eval.padded` (the same
    eval set for a packed and a padded run)."""
    return config.data.packed and not config.eval.padded


def dataset(
    config: ml_collections.ConfigDict, split: str, rows: int, *, train: bool, start: int = 0
):
    """The tf.data pipeline of `split` yielding this process's `rows / process_count` rows."""
    from bert_flax.data import pipeline

    data = config.data
    packed = data.packed if train else eval_packed(config)
    return pipeline.packed_dataset(
        data.data_dir,
        split=split,
        batch_size=local_rows(rows),
        packed=packed,
        max_sequences_per_pack=data.max_sequences_per_pack if packed else 1,
        shuffle=train and data.shuffle,
        seed=config.seed,
        repeat=train,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        algorithm=data.algorithm,
        start_batch=start,
    )


def train_iterator(
    config: ml_collections.ConfigDict,
    rows: int,
    shape: RowShape,
    vocab_size: int,
    *,
    start: int = 0,
) -> Iterator[Batch]:
    """Endless training batches from position `start` on."""
    if config.data.synthetic:
        return synthetic_iterator(config, rows, shape, vocab_size, start=start)
    return dataset(
        config, config.data.train_split, rows, train=True, start=start
    ).as_numpy_iterator()


def eval_batches(
    config: ml_collections.ConfigDict, rows: int, shape: RowShape, vocab_size: int
) -> list[Batch]:
    """The fixed evaluation set: `config.eval.num_batches` batches (0 = the whole split)."""
    num = config.eval.num_batches
    if config.data.synthetic:
        it = synthetic_iterator(config, rows, shape, vocab_size, salt=1)
        return list(itertools.islice(it, num or 1))
    ds = dataset(config, config.data.eval_split, rows, train=False)
    batches = list(itertools.islice(ds.as_numpy_iterator(), num or None))
    if not batches:
        raise ValueError(
            f"The {config.data.eval_split!r} split of {config.data.data_dir} has fewer than "
            f"{rows} rows for one eval batch; lower config.eval.batch_size."
        )
    return batches


def most_frequent_token_accuracy(batches: list[Batch]) -> tuple[int, float]:
    """The token most often masked in `batches` and the masked-LM accuracy of always
    predicting it (the baseline a useful model must beat)."""
    ids = np.concatenate([b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in batches])
    if ids.size == 0:
        return 0, float("nan")
    values, counts = np.unique(ids, return_counts=True)
    best = int(np.argmax(counts))
    return int(values[best]), float(counts[best] / ids.size)
