"""TFRecord shards of pre-training examples: one unpadded example per record, with its length.

Record features (all int64 lists):

| feature | length | meaning |
|---|---|---|
| `input_ids` | n | WordPiece ids with the masks applied, [CLS] A [SEP] B [SEP] |
| `token_type_ids` | n | 0 for [CLS] A [SEP], 1 for B [SEP] |
| `masked_lm_positions` | m | positions of the masked tokens, increasing |
| `masked_lm_ids` | m | their original ids |
| `next_sentence_labels` | 1 | 0 = IsNext, 1 = random next |
| `length` | 1 | n |

``read_table`` loads shards into an ``ExampleTable`` (padded numpy arrays), the in-memory form the
packed pipeline gathers rows from.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Iterator, Sequence

import numpy as np
import tensorflow as tf

from bert_flax.input_pipeline.contract import Example, RowShape
from bert_flax.input_pipeline.rows import RowLayout


def keep_tensorflow_off_accelerators() -> None:
    """The input pipeline runs on the host: hide GPUs/TPUs from TensorFlow (no-op once started)."""
    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except (RuntimeError, ValueError):
            pass  # TensorFlow already initialized its devices, or there is no such kind


keep_tensorflow_off_accelerators()

RAGGED_FEATURES = ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids")
SCALAR_FEATURES = ("next_sentence_labels", "length")


def _int64_list(values) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def serialize(example: Example) -> bytes:
    features = {
        "input_ids": _int64_list(example.input_ids.tolist()),
        "token_type_ids": _int64_list(example.token_type_ids.tolist()),
        "masked_lm_positions": _int64_list(example.masked_lm_positions.tolist()),
        "masked_lm_ids": _int64_list(example.masked_lm_ids.tolist()),
        "next_sentence_labels": _int64_list([example.next_sentence_label]),
        "length": _int64_list([len(example.input_ids)]),
    }
    proto = tf.train.Example(features=tf.train.Features(feature=features))
    return proto.SerializeToString(deterministic=True)  # keys sorted: the same bytes anywhere


def shard_paths(output_dir: str, split: str, num_shards: int) -> list[str]:
    return [
        os.path.join(output_dir, f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord")
        for i in range(num_shards)
    ]


def existing_shards(data_dir: str, split: str) -> list[str]:
    return sorted(glob.glob(os.path.join(data_dir, f"{split}-*.tfrecord")))


def find_shards(data_dir: str, split: str) -> list[str]:
    """The sorted shards of ``split``; a clear error if there are none."""
    files = existing_shards(data_dir, split)
    if not files:
        raise FileNotFoundError(
            f"No {split}-*.tfrecord shards in {data_dir!r}; create them with "
            "`python -m bert_flax.data.create_pretraining_data --output_dir=...`."
        )
    return files


@tf.autograph.experimental.do_not_convert
def parse_batch(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """Parse a batch of records: ragged int32 lists and int32 scalars."""
    spec = {k: tf.io.RaggedFeature(tf.int64) for k in RAGGED_FEATURES}
    spec.update({k: tf.io.FixedLenFeature([1], tf.int64) for k in SCALAR_FEATURES})
    parsed = tf.io.parse_example(serialized, spec)
    out = {k: tf.cast(parsed[k], tf.int32) for k in RAGGED_FEATURES}
    out.update({k: tf.cast(parsed[k][:, 0], tf.int32) for k in SCALAR_FEATURES})
    return out


@dataclasses.dataclass
class ExampleTable:
    """Examples as padded arrays (row i = example i), plus their lengths and prediction counts."""

    input_ids: np.ndarray  # uint16 (int32 for vocabularies over 65,536) [N, max_seq_length]
    token_type_ids: np.ndarray  # int8 [N, max_seq_length]
    masked_lm_positions: np.ndarray  # int16 [N, max_predictions_per_seq]
    masked_lm_ids: np.ndarray  # like input_ids [N, max_predictions_per_seq]
    next_sentence_labels: np.ndarray  # int32 [N]
    lengths: np.ndarray  # int32 [N]
    num_predictions: np.ndarray  # int32 [N]

    def __len__(self) -> int:
        return len(self.lengths)

    def example(self, i: int) -> Example:
        n, m = self.lengths[i], self.num_predictions[i]
        return Example(
            self.input_ids[i, :n],
            self.token_type_ids[i, :n],
            self.masked_lm_positions[i, :m],
            self.masked_lm_ids[i, :m],
            int(self.next_sentence_labels[i]),
        )

    def tokens(self, example: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.input_ids[example, position], self.token_type_ids[example, position]

    def task_features(self, layout: RowLayout, shape: RowShape) -> dict[str, np.ndarray]:
        """Masked positions (shifted to row coordinates) and NSP labels (`rows.build_rows`)."""
        P = shape.max_predictions_per_pack
        counts = layout.per_slot(self.num_predictions)
        if np.any(counts.sum(axis=1) > P):
            raise ValueError(
                f"A pack holds {counts.sum(axis=1).max()} masked positions, more than "
                f"max_predictions_per_pack={P}; raise it (or leave it None to derive a safe bound)."
            )
        slot, example, index, real = layout.spread(counts, P)
        row = np.arange(len(counts))[:, None]
        positions = self.masked_lm_positions[example, index] + layout.starts[row, slot]
        return {
            "masked_lm_positions": np.where(real, positions, 0).astype(np.int32),
            "masked_lm_ids": np.where(real, self.masked_lm_ids[example, index], 0).astype(np.int32),
            "masked_lm_weights": real.astype(np.float32),
            "next_sentence_labels": layout.per_slot(self.next_sentence_labels).astype(np.int32),
        }

    def select(self, indices: np.ndarray) -> ExampleTable:
        return ExampleTable(**{f.name: getattr(self, f.name)[indices] for f in _FIELDS})

    @staticmethod
    def concatenate(tables: Sequence[ExampleTable]) -> ExampleTable:
        return ExampleTable(
            **{f.name: np.concatenate([getattr(t, f.name) for t in tables]) for f in _FIELDS}
        )


_FIELDS = dataclasses.fields(ExampleTable)


def iterate_tables(
    dataset: tf.data.Dataset, max_seq_length: int, max_predictions: int, batch_size: int = 4096
) -> Iterator[ExampleTable]:
    """ExampleTables from a dataset of serialized records, ``batch_size`` records at a time."""

    @tf.autograph.experimental.do_not_convert
    def to_dense(parsed):
        dense = {
            "input_ids": parsed["input_ids"].to_tensor(shape=[None, max_seq_length]),
            "token_type_ids": parsed["token_type_ids"].to_tensor(shape=[None, max_seq_length]),
            "masked_lm_positions": parsed["masked_lm_positions"].to_tensor(
                shape=[None, max_predictions]
            ),
            "masked_lm_ids": parsed["masked_lm_ids"].to_tensor(shape=[None, max_predictions]),
            "next_sentence_labels": parsed["next_sentence_labels"],
            "lengths": parsed["length"],
            "num_predictions": tf.cast(parsed["masked_lm_positions"].row_lengths(), tf.int32),
            "ids_lengths": tf.cast(parsed["input_ids"].row_lengths(), tf.int32),
        }
        return dense

    dataset = dataset.batch(batch_size).map(parse_batch).map(to_dense)
    for batch in dataset.as_numpy_iterator():
        ids_lengths = batch.pop("ids_lengths")
        if np.any(ids_lengths != batch["lengths"]) or np.any(ids_lengths > max_seq_length):
            raise ValueError(
                "Corrupted records: `length` disagrees with `input_ids` (or exceeds "
                f"max_seq_length={max_seq_length}); recreate the data."
            )
        if np.any(batch["num_predictions"] > max_predictions):
            raise ValueError(
                f"A record has more than {max_predictions} masked positions; the summary's "
                "max_predictions_per_seq does not match the records."
            )
        yield ExampleTable(**_compact(batch))


def _compact(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Smaller dtypes for the in-memory table (~3L + 4M bytes an example instead of 8L + 8M)."""
    small_ids = lambda a: a.astype(np.uint16) if a.size == 0 or a.max() < 2**16 else a
    return {
        **batch,
        "input_ids": small_ids(batch["input_ids"]),
        "token_type_ids": batch["token_type_ids"].astype(np.int8),
        "masked_lm_positions": batch["masked_lm_positions"].astype(np.int16),
        "masked_lm_ids": small_ids(batch["masked_lm_ids"]),
    }


def read_table(
    files: Sequence[str],
    max_seq_length: int,
    max_predictions: int,
    *,
    shard: tuple[int, int] = (0, 1),
) -> ExampleTable:
    """Every record of ``files`` in order (``shard=(k, n)`` keeps records k, k+n, ...)."""
    dataset = tf.data.TFRecordDataset(list(files))
    if shard[1] > 1:
        dataset = dataset.shard(shard[1], shard[0])
    return _one_table(iterate_tables(dataset, max_seq_length, max_predictions), max_seq_length,
                      max_predictions)  # fmt: skip


def table_from_serialized(
    serialized: Sequence[bytes], max_seq_length: int, max_predictions: int
) -> ExampleTable:
    """The examples of serialized records, in order."""
    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(list(serialized), tf.string))
    tables = iterate_tables(dataset, max_seq_length, max_predictions)
    return _one_table(tables, max_seq_length, max_predictions)


def empty_table(max_seq_length: int, max_predictions: int) -> ExampleTable:
    return ExampleTable(
        input_ids=np.zeros((0, max_seq_length), np.uint16),
        token_type_ids=np.zeros((0, max_seq_length), np.int8),
        masked_lm_positions=np.zeros((0, max_predictions), np.int16),
        masked_lm_ids=np.zeros((0, max_predictions), np.uint16),
        next_sentence_labels=np.zeros((0,), np.int32),
        lengths=np.zeros((0,), np.int32),
        num_predictions=np.zeros((0,), np.int32),
    )


def _one_table(
    tables: Iterator[ExampleTable], max_seq_length: int, max_predictions: int
) -> ExampleTable:
    parts = list(tables)
    if not parts:
        return empty_table(max_seq_length, max_predictions)
    return parts[0] if len(parts) == 1 else ExampleTable.concatenate(parts)
