"""Where every record of a split is: file, byte offset, size, and the example's token length.

    index = RecordIndex.load_or_build(data_dir, "train")    # DIR/index/train.npz, once
    table = index.read(np.arange(1000, 2000), max_seq_length=128, max_predictions=20)

With it the packed pipeline reads any window of records by byte range (no replay of what comes
before it), packs and locates a stream position from the lengths alone, and keeps per record
only 18 bytes in memory (16.3M records: 293 MB) instead of the examples themselves.

A TFRecord file is a sequence of frames: an 8-byte little-endian payload length, a 4-byte CRC of
it, the payload (here a serialized ``tf.train.Example``), a 4-byte CRC of the payload. The index
is written by ``create_pretraining_data`` next to the shards it writes; for data prepared before
it existed, the first ``load_or_build`` scans the frames (headers only) and parses the lengths
once, then caches the index (or keeps it in memory if the data directory is read-only).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from google.protobuf import message

from bert_flax.input_pipeline import records

INDEX_DIR = "index"
FRAME_HEADER_BYTES = 12  # uint64 length + uint32 CRC
FRAME_OVERHEAD_BYTES = 16  # header + uint32 CRC of the payload
READ_CHUNK = 16384  # records parsed at once when reading


@dataclasses.dataclass(frozen=True)
class RecordIndex:
    """Records of one split in file order: ``files[file_ids[i]]`` holds record i's payload of
    ``sizes[i]`` bytes at ``offsets[i] + FRAME_HEADER_BYTES``; ``lengths[i]`` is its tokens,
    ``num_predictions[i]`` its masked positions."""

    files: tuple[str, ...]
    file_ids: np.ndarray  # int16 [N]
    offsets: np.ndarray  # int64 [N] byte offset of the frame
    sizes: np.ndarray  # int32 [N] payload bytes
    lengths: np.ndarray  # int32 [N]
    num_predictions: np.ndarray  # int16 [N]

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def from_sizes(
        cls,
        files: Sequence[str],
        sizes_per_file: Sequence[Sequence[int]],
        lengths: Sequence[int],
        num_predictions: Sequence[int],
    ) -> RecordIndex:
        """The index of written files: payload sizes per file; lengths and prediction counts
        of the records in file order."""
        file_ids, offsets = [], []
        for f, sizes in enumerate(sizes_per_file):
            frame = np.asarray(sizes, np.int64) + FRAME_OVERHEAD_BYTES
            offsets.append(np.concatenate([[0], np.cumsum(frame)[:-1]]).astype(np.int64))
            file_ids.append(np.full(len(sizes), f, np.int16))
        sizes = np.concatenate([np.asarray(s, np.int64) for s in sizes_per_file] or [[]])
        return cls(
            files=tuple(os.path.basename(f) for f in files),
            file_ids=np.concatenate(file_ids or [[]]).astype(np.int16),
            offsets=np.concatenate(offsets or [[]]).astype(np.int64),
            sizes=sizes.astype(np.int32),
            lengths=np.asarray(lengths, np.int32),
            num_predictions=np.asarray(num_predictions, np.int16),
        )

    @classmethod
    def build(cls, files: Sequence[str]) -> RecordIndex:
        """Scans the frames of ``files`` and parses each record's length and predictions."""
        sizes_per_file = [_frame_sizes(path) for path in files]
        for path, sizes in zip(files, sizes_per_file, strict=True):
            if sizes:
                _check_first_record(path, sizes[0])
        lengths, num_predictions = _parse_lengths(files)
        if len(lengths) != sum(len(s) for s in sizes_per_file):
            raise ValueError(f"Frames and records of {list(files)} disagree; recreate the data.")
        return cls.from_sizes(files, sizes_per_file, lengths, num_predictions)

    def save(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez(
            path,
            files=np.asarray(self.files),
            file_ids=self.file_ids,
            offsets=self.offsets,
            sizes=self.sizes,
            lengths=self.lengths,
            num_predictions=self.num_predictions,
        )

    @classmethod
    def load(cls, path: str) -> RecordIndex:
        with np.load(path) as data:
            return cls(
                files=tuple(str(f) for f in data["files"]),
                file_ids=data["file_ids"],
                offsets=data["offsets"],
                sizes=data["sizes"],
                lengths=data["lengths"],
                num_predictions=data["num_predictions"],
            )

    @classmethod
    def load_or_build(cls, data_dir: str, split: str) -> RecordIndex:
        """The split's index from DIR/index/SPLIT.npz, built (and cached) if missing or stale."""
        files = records.find_shards(data_dir, split)
        path = index_path(data_dir, split)
        names = tuple(os.path.basename(f) for f in files)
        if os.path.isfile(path):
            index = cls.load(path)
            if index.files == names and _ends_match(index, data_dir):
                return index
        index = cls.build(files)
        try:
            index.save(path)
        except OSError:
            pass  # a read-only data dir: keep the index in memory
        return index

    def read(
        self,
        records_wanted: np.ndarray,
        max_seq_length: int,
        max_predictions: int,
        data_dir: str,
        *,
        chunk: int = READ_CHUNK,
    ) -> records.ExampleTable:
        """The examples of ``records_wanted`` (record numbers), in that order, read by byte
        range (each run of consecutive records of a file is one read) and parsed ``chunk``
        records at a time, so the raw bytes held at once stay small."""
        wanted = np.asarray(records_wanted, np.int64)
        parts = [
            self._read_chunk(wanted[i : i + chunk], max_seq_length, max_predictions, data_dir)
            for i in range(0, wanted.size, chunk)
        ]
        if not parts:
            return records.empty_table(max_seq_length, max_predictions)
        table = parts[0] if len(parts) == 1 else records.ExampleTable.concatenate(parts)
        if not np.array_equal(table.lengths, self.lengths[wanted]):
            raise ValueError(
                f"Records of {data_dir} disagree with {INDEX_DIR}/: the shards changed after "
                f"the index was written; delete {os.path.join(data_dir, INDEX_DIR)} to rebuild it."
            )
        return table

    def _read_chunk(
        self, wanted: np.ndarray, max_seq_length: int, max_predictions: int, data_dir: str
    ) -> records.ExampleTable:
        order = np.argsort(wanted, kind="stable")
        ordered = wanted[order]
        payloads: list[bytes] = [b""] * wanted.size
        breaks = np.flatnonzero((np.diff(ordered) != 1) | (np.diff(self.file_ids[ordered]) != 0))
        for run in np.split(np.arange(ordered.size), breaks + 1):
            first, last = ordered[run[0]], ordered[run[-1]]
            start = int(self.offsets[first])
            end = int(self.offsets[last]) + FRAME_OVERHEAD_BYTES + int(self.sizes[last])
            with open(os.path.join(data_dir, self.files[self.file_ids[first]]), "rb") as f:
                f.seek(start)
                data = f.read(end - start)
            for position, record in zip(run, ordered[run]):
                begin = int(self.offsets[record]) - start + FRAME_HEADER_BYTES
                payloads[order[position]] = data[begin : begin + int(self.sizes[record])]
        return records.table_from_serialized(payloads, max_seq_length, max_predictions)


def index_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, INDEX_DIR, f"{split}.npz")


def _ends_match(index: RecordIndex, data_dir: str) -> bool:
    """Whether each file ends where the index says its last frame does (a cheap staleness check)."""
    for f, name in enumerate(index.files):
        in_file = np.flatnonzero(index.file_ids == f)
        end = 0
        if in_file.size:
            last = in_file[-1]
            end = int(index.offsets[last]) + FRAME_OVERHEAD_BYTES + int(index.sizes[last])
        path = os.path.join(data_dir, name)
        if not os.path.isfile(path) or os.path.getsize(path) != end:
            return False
    return True


def _frame_sizes(path: str) -> list[int]:
    """Payload sizes of the frames of one TFRecord file (headers read, payloads skipped)."""
    sizes, size_of_file = [], os.path.getsize(path)
    with open(path, "rb") as f:
        position = 0
        while position < size_of_file:
            header = f.read(FRAME_HEADER_BYTES)
            if len(header) < FRAME_HEADER_BYTES:
                raise ValueError(f"{path} ends inside a record header; recreate the data.")
            (size,) = struct.unpack("<Q", header[:8])
            sizes.append(size)
            position += FRAME_OVERHEAD_BYTES + size
            f.seek(position)
        if position != size_of_file:
            raise ValueError(f"{path} ends inside a record; recreate the data.")
    return sizes


def _check_first_record(path: str, size: int) -> None:
    """ValueError unless the first record of ``path`` (``size`` bytes) is a pre-training
    example: a shard of other data, named before tf.data meets it."""
    with open(path, "rb") as f:
        f.seek(FRAME_HEADER_BYTES)
        payload = f.read(size)
    try:
        features = set(tf.train.Example.FromString(payload).features.feature)
    except message.DecodeError:
        features = set()
    missing = sorted({"length", "masked_lm_positions"} - features)
    if missing:
        raise ValueError(
            f"{path} holds records that are not pre-training examples (no {missing}); "
            "recreate the data."
        )


def _parse_lengths(files: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, masked positions) of every record of ``files``, in order."""
    spec = {
        "length": tf.io.FixedLenFeature([1], tf.int64),
        "masked_lm_positions": tf.io.RaggedFeature(tf.int64),
    }

    @tf.autograph.experimental.do_not_convert
    def counts(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        return parsed["length"][:, 0], parsed["masked_lm_positions"].row_lengths()

    dataset = tf.data.TFRecordDataset(list(files)).batch(8192).map(counts)
    parts = list(dataset.as_numpy_iterator())
    if not parts:
        return np.zeros(0, np.int32), np.zeros(0, np.int16)
    lengths = np.concatenate([p[0] for p in parts]).astype(np.int32)
    return lengths, np.concatenate([p[1] for p in parts]).astype(np.int16)
