"""The packed tf.data input pipeline: pre-training records -> fixed-shape batches of rows.

    ds = packed_dataset("/tmp/sotu128", 32)           # packed, D = 3
    batch = next(ds.as_numpy_iterator())              # the packed batch: contract.py
    base = padded_dataset("/tmp/sotu128", 32)         # padded, one sequence a row
    ds = packed_dataset("/tmp/sotu128", 32, InputOptions(seed=1, repeat=False))

How packed rows are made:

1. Each host takes its share of the split's records (whole shards when their number divides
   evenly, otherwise every ``process_count``-th record). The record index
   (``record_index.RecordIndex``: file, byte offset, size, tokens and masked positions of every
   record, 18 bytes each) says where each one is, so nothing has to be read to plan an epoch.
2. Per epoch the host's records are cut into windows of ``pack_window`` examples (blocks of
   consecutive records in a random order; a split that fits is one window, read once and kept).
   Per window, ``packing.assign_sequences`` maps example indices to packs following the
   strategies (``strategies.json`` scaled to the window; solved from ``histogram.txt`` if
   missing), random within each length; examples the strategies do not cover go to the
   fallback packer at depth D, none are dropped (``planner.EpochPlanner``). Memory: one or two
   windows and the index.
3. A resumed stream starts at its position, computed from the index's lengths
   (``packing.count_packs`` per window), never by replaying batches.
4. The pack order is shuffled; batches of packs become rows by one vectorized numpy gather
   (``rows.build_rows``) on ``workers`` threads of tf.data's parallel map, in a deterministic order.

``streaming=True`` packs on the fly with ``packing.OnlinePacker`` (bounded memory, no strategies,
no index; resume counts packs by reading). ``padded_dataset`` gives one example per row with the
same features (D = 1), planned the same way (one example a pack, shuffled per window).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

import packing
from bert_flax.input_pipeline import records
from bert_flax.input_pipeline.contract import (
    PRETRAINING_FEATURES,
    PreparedData,
    RowShape,
    feature_dtype,
    load_strategies,
)
from bert_flax.input_pipeline.planner import (
    DEFAULT_PACK_WINDOW,
    EpochPlanner,
    epoch_seeds,
    host_records,
    host_share,
)
from bert_flax.input_pipeline.record_index import RecordIndex
from bert_flax.input_pipeline.records import ExampleTable
from bert_flax.input_pipeline.rows import build_rows


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """How ``packed_dataset``, ``padded_dataset`` and ``pack_stats`` read a prepared directory.

    Attributes:
      split: the split to read.
      max_sequences_per_pack: D, the sequence slots per row (packed rows only).
      max_predictions_per_pack: P; default a bound no pack can exceed (see
        ``contract.max_predictions_per_pack``); a pack over an explicit P raises.
      strategies: a StrategySet or a strategies.json path (default DIR/strategies.json, solved
        with ``algorithm`` from histogram.txt if missing).
      pack_window: examples per window (default ``DEFAULT_PACK_WINDOW``): a host's split up to
        this size is one window, kept in memory across epochs; a larger one is read a window at
        a time (memory bounded by the window, not the split).
      streaming: pack on the fly with packing.OnlinePacker (no strategies, no record index);
        ``shuffle_buffer`` records shuffled, ``online_buffer_size`` packs open.
      shuffle, seed: shuffle windows, examples within each length, and pack order, per epoch.
      repeat: loop over epochs forever (rows flow across epoch boundaries).
      drop_remainder: drop the last partial batch (only matters with repeat=False).
      start_batch: begin where a stream that had already yielded this many batches stands
        (resume). The position is computed from the record index's lengths (packs counted per
        window, nothing read or built); streaming, by reading and counting packs.
      process_index, process_count: this host's share (default jax.process_index()/count()).
      workers: threads building rows (tf.data's parallel map; the order stays deterministic).
      prefetch: batches tf.data prepares ahead.
    """

    split: str = "train"
    max_sequences_per_pack: int = 3
    max_predictions_per_pack: int | None = None
    strategies: str | packing.StrategySet | None = None
    algorithm: str = "nnlshp"
    pack_window: int | None = None
    streaming: bool = False
    shuffle_buffer: int = 16384
    online_buffer_size: int = 256
    shuffle: bool = True
    seed: int = 0
    repeat: bool = True
    drop_remainder: bool = True
    start_batch: int = 0
    process_index: int | None = None
    process_count: int | None = None
    workers: int = 2
    prefetch: int = 2

    def __post_init__(self):
        if self.max_sequences_per_pack < 1:
            raise ValueError(
                f"max_sequences_per_pack must be >= 1, got {self.max_sequences_per_pack}."
            )
        if self.start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {self.start_batch}.")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}.")
        if self.pack_window is not None and self.pack_window < 1:
            raise ValueError(
                f"pack_window must be >= 1 (or None for the default), got {self.pack_window}."
            )

    def place(self) -> tuple[int, int]:
        """(process_index, process_count), jax's where not given."""
        if self.process_index is not None and self.process_count is not None:
            return self.process_index, self.process_count
        import jax  # only to learn this host's place; the pipeline itself is TF + numpy

        index = jax.process_index() if self.process_index is None else self.process_index
        count = jax.process_count() if self.process_count is None else self.process_count
        return index, count


def dataset_spec(shape: RowShape, batch_size: int | None) -> dict[str, tf.TensorSpec]:
    """The element spec of ``packed_dataset``: every feature of the contract, batch dim first."""
    return {
        name: tf.TensorSpec(
            (batch_size, *shape.feature_shape(name)), tf.as_dtype(feature_dtype(name)), name=name
        )
        for name in PRETRAINING_FEATURES
    }


class _LiveTables:
    """Example tables that batches in flight still read, by serial number. A table goes once
    its reader said no more batches will need it (``release``) and every batch that was going
    to (``expect``) has been built or cancelled: tf.data builds rows on several threads."""

    def __init__(self):
        self._tables: dict[int, ExampleTable] = {}
        self._pending: dict[int, int] = {}
        self._released: set[int] = set()
        self._lock = threading.Lock()
        self._next = 0

    def add(self, table: ExampleTable) -> int:
        with self._lock:
            serial, self._next = self._next, self._next + 1
            self._tables[serial], self._pending[serial] = table, 0
            return serial

    def expect(self, serial: int) -> None:
        """One more batch will read ``serial``."""
        with self._lock:
            self._pending[serial] += 1

    def finish(self, serial: int) -> None:
        """An expected batch no longer needs ``serial`` (its rows are built, or it was dropped)."""
        with self._lock:
            self._pending[serial] -= 1
            self._drop_if_done(serial)

    def release(self, serial: int) -> None:
        """No batch beyond those already expected will read ``serial``."""
        with self._lock:
            self._released.add(serial)
            self._drop_if_done(serial)

    def build(self, serials: np.ndarray, slots: np.ndarray, shape: RowShape) -> dict:
        """The rows of one batch: row i packs examples ``slots[i]`` (-1 = empty) of table
        ``serials[i]``."""
        parts = []
        for serial in dict.fromkeys(serials.tolist()):
            with self._lock:
                table = self._tables[serial]
            rows = np.flatnonzero(serials == serial)
            packs = [[i for i in row if i >= 0] for row in slots[rows].tolist()]
            parts.append(build_rows(table, packs, shape))
            self.finish(serial)
        if len(parts) == 1:
            return parts[0]
        return _concatenate(parts)  # consecutive tables: rows stay in order

    def _drop_if_done(self, serial: int) -> None:
        if serial in self._released and self._pending[serial] == 0:
            del self._tables[serial], self._pending[serial]
            self._released.discard(serial)


def _concatenate(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _online_packs(
    tables: Iterator[ExampleTable], shape: RowShape, buffer_size: int, group: int
) -> Iterator[tuple[ExampleTable, list[list[int]]]]:
    """(table, packs) pairs from the online packer, ``group`` packs at a time (the last may be
    fewer); each table holds just its packs' examples."""
    packer = packing.OnlinePacker(shape.max_seq_length, shape.max_sequences_per_pack, buffer_size)
    pending: dict[int, tuple[ExampleTable, int]] = {}
    next_index = 0

    def emit(packs):
        """One table with exactly the examples of ``packs`` (gathered per source table)."""
        flat = [i for p in packs for i in p]
        groups: dict[int, tuple[ExampleTable, list[int], list[int]]] = {}
        for k, index in enumerate(flat):
            source, row = pending.pop(index)
            groups.setdefault(id(source), (source, [], []))
            groups[id(source)][1].append(k)
            groups[id(source)][2].append(row)
        parts = [source.select(np.asarray(rows)) for source, _, rows in groups.values()]
        order = np.concatenate([np.asarray(ks) for _, ks, _ in groups.values()])
        row_of = np.empty(len(flat), dtype=np.int64)
        row_of[order] = np.arange(len(flat))
        local, k = [], 0
        for p in packs:
            local.append(row_of[k : k + len(p)].tolist())
            k += len(p)
        return ExampleTable.concatenate(parts), local

    done: list[list[int]] = []
    for table in tables:
        for row, length in enumerate(table.lengths.tolist()):
            pending[next_index] = (table, row)
            done.extend(packer.add(next_index, length))
            next_index += 1
            if len(done) >= group:
                yield emit(done)
                done = []
    done.extend(packer.flush())
    for start in range(0, len(done), group):
        yield emit(done[start : start + group])
    if pending:
        raise RuntimeError(f"The online packer lost {len(pending)} examples.")


def packed_dataset(
    data_dir: str, batch_size: int, options: InputOptions = InputOptions()
) -> tf.data.Dataset:
    """Batches of ``batch_size`` packed rows of the prepared directory ``data_dir`` (the output of
    ``create_pretraining_data``: shards, histogram.txt, summary.json), exactly the packed-batch
    contract (see the module docstring)."""
    return _dataset(data_dir, batch_size, options, packed=True)


def padded_dataset(
    data_dir: str, batch_size: int, options: InputOptions = InputOptions()
) -> tf.data.Dataset:
    """The padded baseline: batches of rows of one example each (D = 1), the same features and
    order options as ``packed_dataset`` (its packing options unused)."""
    return _dataset(data_dir, batch_size, options, packed=False)


def pack_stats(data_dir: str, options: InputOptions = InputOptions()) -> dict[str, float]:
    """What the first epoch of ``packed_dataset(data_dir, ..., options)`` gives this host, from
    the planner alone (no example is read): rows, sequences, windows, achieved vs predicted
    efficiency, packing factor (e.g. to size steps per epoch)."""
    data = PreparedData.load(data_dir)
    L = data.max_seq_length
    index, planner = _epoch_planner(
        data_dir, options, data.row_shape(options.max_sequences_per_pack)
    )
    plan = planner.plan(0)
    rows = sum(window.packs for window in plan)
    lengths = index.lengths[planner.host]
    return {
        "sequences": len(lengths),
        "rows": rows,
        "windows": len(plan),
        "packing_factor": len(lengths) / max(1, rows),
        "achieved_efficiency": 100.0 * float(lengths.sum()) / max(1, rows * L),
        "predicted_efficiency": float(planner.strategy_set.metrics().efficiency),
        "padded_efficiency": 100.0 * float(lengths.sum()) / max(1, len(lengths) * L),
    }


def _epoch_planner(
    data_dir: str, options: InputOptions, shape: RowShape, packed: bool = True
) -> tuple[RecordIndex, EpochPlanner]:
    """The record index of the split and this host's planner (strategies for packed rows)."""
    process_index, process_count = options.place()
    shards = records.find_shards(data_dir, options.split)
    files, shard = host_share(shards, process_index, process_count)
    index = RecordIndex.load_or_build(data_dir, options.split)
    strategy_set = None
    if packed:
        strategy_set = load_strategies(
            data_dir,
            options.strategies,
            shape.max_seq_length,
            shape.max_sequences_per_pack,
            options.algorithm,
        )
    planner = EpochPlanner(
        index.lengths,
        host_records(index, files, shard),
        options.pack_window or DEFAULT_PACK_WINDOW,
        strategy_set,
        options.shuffle,
        epoch_seeds(options.seed, options.shuffle, process_index),
    )
    return index, planner


def _dataset(
    data_dir: str, batch_size: int, options: InputOptions, packed: bool
) -> tf.data.Dataset:
    """The composition: EpochPlanner (or the online packer), the batch descriptors and the
    tf.data adapter."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    data = PreparedData.load(data_dir)
    shape = data.row_shape(options.max_sequences_per_pack, packed=packed)
    if options.max_predictions_per_pack:
        shape = dataclasses.replace(
            shape, max_predictions_per_pack=options.max_predictions_per_pack
        )
    process_index, process_count = options.place()
    empty = f"Host {process_index} of {process_count} has no {options.split} examples."
    tables = _LiveTables()
    start_rows = options.start_batch * batch_size
    if options.streaming:
        files, shard = host_share(
            records.find_shards(data_dir, options.split), process_index, process_count
        )
        source = _Source(files, shard, data.max_seq_length, data.max_predictions_per_seq)
        seeds = epoch_seeds(options.seed, options.shuffle, process_index)
        pairs = functools.partial(
            _online_pairs, source, shape, tables, start_rows, batch_size, options, seeds, empty
        )
    else:
        index, planner = _epoch_planner(data_dir, options, shape, packed)
        _check_host_records(index, planner.host, shape, empty, options.split)
        read = functools.partial(
            index.read,
            max_seq_length=data.max_seq_length,
            max_predictions=data.max_predictions_per_seq,
            data_dir=data_dir,
        )
        pairs = functools.partial(_planned_pairs, planner, read, tables, start_rows, options.repeat)

    def descriptors() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return _batch_descriptors(pairs(), tables, shape, batch_size, options.drop_remainder)

    spec = dataset_spec(shape, batch_size if options.drop_remainder or options.repeat else None)
    return _rows_dataset(descriptors, tables, shape, spec, options.workers).prefetch(
        options.prefetch
    )


def _check_host_records(
    index: RecordIndex, host: np.ndarray, shape: RowShape, empty: str, split: str
) -> None:
    """Every record of the host fits the row shape (it is not cut); the host has some."""
    if len(host) == 0:
        raise ValueError(empty)
    L, P = shape.max_seq_length, shape.max_predictions_per_pack
    most = int(index.lengths[host].max())
    if most > L:
        raise ValueError(f"A {split} record has {most} tokens, more than max_seq_length={L}.")
    most = int(index.num_predictions[host].max())
    if most > P:
        raise ValueError(
            f"An example has {most} masked positions, more than max_predictions_per_pack="
            f"{P}; raise it (or leave it None to derive a safe bound)."
        )


def _planned_pairs(
    planner: EpochPlanner,
    read: Callable[[np.ndarray], ExampleTable],
    tables: _LiveTables,
    start_rows: int,
    repeat: bool,
) -> Iterator[tuple[int, list[list[int]]]]:
    """(table serial, packs) per window: the window's examples read into a live table, released
    once its batches are described; a split of one window is read once and kept."""
    whole_split = None
    for plan, w, packs in planner.windows(start_rows, repeat):
        if len(plan) == 1:
            if whole_split is None:
                whole_split = tables.add(read(plan[0].records))
            yield whole_split, packs
        else:
            serial = tables.add(read(plan[w].records))
            yield serial, packs
            tables.release(serial)


def _online_pairs(
    source: _Source,
    shape: RowShape,
    tables: _LiveTables,
    start_rows: int,
    batch_size: int,
    options: InputOptions,
    seeds: Callable[[int], int],
    empty: str,
) -> Iterator[tuple[int, list[list[int]]]]:
    """(table serial, packs) from the online packer; resume counts packs as they come."""
    to_skip, epoch = start_rows, 0
    while True:
        made = 0
        stream = source.stream(options.shuffle, seeds(epoch), options.shuffle_buffer)
        for table, packs in _online_packs(stream, shape, options.online_buffer_size, batch_size):
            made += len(packs)
            dropped = min(to_skip, len(packs))
            packs, to_skip = packs[dropped:], to_skip - dropped
            if packs:
                serial = tables.add(table)
                yield serial, packs
                tables.release(serial)
        if made == 0:
            raise ValueError(empty)
        epoch += 1
        if not options.repeat:
            return


def _batch_descriptors(
    pairs: Iterator[tuple[int, list[list[int]]]],
    tables: _LiveTables,
    shape: RowShape,
    batch_size: int,
    drop_remainder: bool,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per batch: the table serial of each row and its slots (example rows, -1 = empty)."""
    D = shape.max_sequences_per_pack
    serials, slots = [], []
    for serial, packs in pairs:
        for pack in packs:
            if len(pack) > D:
                raise ValueError(f"A pack holds {len(pack)} sequences, more than D={D}.")
            if not serials or serials[-1] != serial or len(slots) % batch_size == 0:
                tables.expect(serial)  # one expectation per (batch, table) part
            serials.append(serial)
            slots.append(list(pack) + [-1] * (D - len(pack)))
            if len(slots) == batch_size:
                yield np.asarray(serials, np.int64), np.asarray(slots, np.int64)
                serials, slots = [], []
    if slots and not drop_remainder:
        yield np.asarray(serials, np.int64), np.asarray(slots, np.int64)
    elif slots:  # the dropped remainder: its expected parts will not be built
        for serial in dict.fromkeys(serials):
            tables.finish(serial)


def _rows_dataset(
    descriptors: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
    tables: _LiveTables,
    shape: RowShape,
    spec: dict[str, tf.TensorSpec],
    workers: int,
) -> tf.data.Dataset:
    """The tf.data adapter: batch descriptors from a generator, rows built from the live tables
    on ``workers`` threads of a parallel map (deterministic order)."""
    names = list(spec)

    def build(serials: np.ndarray, slots: np.ndarray) -> list[np.ndarray]:
        rows = tables.build(serials, slots, shape)
        return [rows[name] for name in names]

    @tf.autograph.experimental.do_not_convert
    def to_rows(serials, slots):
        values = tf.numpy_function(build, [serials, slots], [spec[n].dtype for n in names])
        rows = {}
        for name, value in zip(names, values):
            value.set_shape(spec[name].shape)
            rows[name] = value
        return rows

    dataset = tf.data.Dataset.from_generator(
        descriptors,
        output_signature=(
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([None, shape.max_sequences_per_pack], tf.int64),
        ),
    )
    return dataset.map(to_rows, num_parallel_calls=workers, deterministic=True)


@dataclasses.dataclass
class _Source:
    """How the online packer reads a host's examples: shuffled records, a table at a time."""

    files: list[str]
    shard: tuple[int, int]
    max_seq_length: int
    max_predictions_per_seq: int
    read_batch: int = 1024

    def stream(self, shuffle: bool, seed: int, shuffle_buffer: int) -> Iterator[ExampleTable]:
        files = list(self.files)
        if shuffle and self.shard[1] == 1:
            np.random.default_rng(seed).shuffle(files)
        dataset = tf.data.TFRecordDataset(files)
        if self.shard[1] > 1:
            dataset = dataset.shard(self.shard[1], self.shard[0])
        if shuffle:
            dataset = dataset.shuffle(shuffle_buffer, seed=seed)
        yield from records.iterate_tables(
            dataset, self.max_seq_length, self.max_predictions_per_seq, self.read_batch
        )
