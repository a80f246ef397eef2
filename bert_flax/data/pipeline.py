"""The packed tf.data input pipeline: pre-training records -> fixed-shape packed batches.

    ds = packed_dataset("/tmp/sotu128", batch_size=32)          # packed, D = 3
    batch = next(ds.as_numpy_iterator())                         # bert_flax.data.contract
    base = packed_dataset("/tmp/sotu128", batch_size=32, packed=False)   # padded, D = 1

How rows are made (``packed=True``, the default):

1. Each host reads its share of the split's records (whole shards when their number divides
   evenly, otherwise every ``process_count``-th record), ``pack_window`` examples at a time
   (default: all of them, read once and kept in memory).
2. Per epoch and window, ``packing.assign_sequences`` maps example indices to packs following the
   strategies (``strategies.json``, scaled to the window's size; computed from ``histogram.txt``
   if missing). It groups by length and shuffles within each length with the epoch's seed;
   examples the strategies do not cover go to the library's fallback packer, none are dropped.
3. Pack order is shuffled, and each batch of packs becomes rows by one vectorized numpy gather
   (``build_rows``), so Python does O(batch) work per batch, not O(tokens).

``streaming=True`` packs on the fly with ``packing.OnlinePacker`` (bounded memory, no strategies);
``packed=False`` gives one example per row with the same features (D = 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
import tensorflow as tf

import packing
from bert_flax.data import records
from bert_flax.data.contract import (
    FEATURES,
    FLOAT_FEATURES,
    PreparedData,
    RowShape,
    feature_dtype,
    load_strategies,
)
from bert_flax.data.records import ExampleTable


def dataset_spec(shape: RowShape, batch_size: int | None) -> dict[str, tf.TensorSpec]:
    """The element spec of ``packed_dataset``: every feature of the contract, batch dim first."""
    return {
        name: tf.TensorSpec(
            (batch_size, *shape.feature_shape(name)), tf.as_dtype(feature_dtype(name)), name=name
        )
        for name in FEATURES
    }


def build_rows(table: ExampleTable, packs: Sequence[Sequence[int]], shape: RowShape) -> dict:
    """Rows of the packed-batch contract for ``packs`` (lists of row indices into ``table``)."""
    L, D, P = shape.max_seq_length, shape.max_sequences_per_pack, shape.max_predictions_per_pack
    B = len(packs)
    slots = np.full((B, D), -1, dtype=np.int64)
    for b, pack in enumerate(packs):
        if len(pack) > D:
            raise ValueError(f"A pack holds {len(pack)} sequences, more than D={D}.")
        slots[b, : len(pack)] = pack
    valid = slots >= 0
    source = np.where(valid, slots, 0)
    lengths = np.where(valid, table.lengths[source], 0)
    ends = np.cumsum(lengths, axis=1)
    starts = ends - lengths
    num_predictions = np.where(valid, table.num_predictions[source], 0)
    prediction_ends = np.cumsum(num_predictions, axis=1)
    if np.any(ends[:, -1] > L):
        raise ValueError(f"A pack holds {ends[:, -1].max()} tokens, more than L={L}.")
    if np.any(prediction_ends[:, -1] > P):
        raise ValueError(
            f"A pack holds {prediction_ends[:, -1].max()} masked positions, more than "
            f"max_predictions_per_pack={P}; raise it (or leave it None to derive a safe bound)."
        )

    batch = np.arange(B)[:, None]

    def gather(counts_ends, starts_of, width):
        """Per column j < width: its slot, source example, index inside the example, realness."""
        j = np.arange(width)
        slot = np.minimum((j[None, None, :] >= counts_ends[:, :, None]).sum(axis=1), D - 1)
        real = j[None, :] < counts_ends[:, -1:]
        offset = np.where(real, j[None, :] - starts_of[batch, slot], 0)
        return slot, source[batch, slot], offset, real

    slot, example, position, real = gather(ends, starts, L)
    rows = {
        "input_ids": np.where(real, table.input_ids[example, position], 0),
        "token_type_ids": np.where(real, table.token_type_ids[example, position], 0),
        "segment_ids": np.where(real, slot + 1, 0),
        "positions": position,
    }
    pslot, pexample, pindex, preal = gather(prediction_ends, prediction_ends - num_predictions, P)
    rows["masked_lm_positions"] = np.where(
        preal, table.masked_lm_positions[pexample, pindex] + starts[batch, pslot], 0
    )
    rows["masked_lm_ids"] = np.where(preal, table.masked_lm_ids[pexample, pindex], 0)
    rows["masked_lm_weights"] = preal.astype(np.float32)
    rows["nsp_positions"] = np.where(valid, starts, 0)
    rows["next_sentence_labels"] = np.where(valid, table.next_sentence_labels[source], 0)
    rows["sequence_mask"] = valid.astype(np.float32)
    return {k: v if k in FLOAT_FEATURES else v.astype(np.int32) for k, v in rows.items()}


def host_share(
    files: Sequence[str], process_index: int, process_count: int
) -> tuple[list[str], tuple[int, int]]:
    """This host's files and record shard: whole files if they divide evenly, else every
    ``process_count``-th record."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is not in [0, {process_count}).")
    if process_count == 1:
        return list(files), (0, 1)
    if len(files) % process_count == 0:
        return list(files[process_index::process_count]), (0, 1)
    return list(files), (process_index, process_count)


def scale_strategies(strategy_set: packing.StrategySet, num_sequences: int) -> packing.StrategySet:
    """The strategies scaled to a window of ``num_sequences`` (a host's share, or a window)."""
    total = sum(len(s) * c for s, c in strategy_set.strategies)
    if total == 0 or num_sequences >= total:
        return strategy_set
    fraction = num_sequences / total
    return packing.StrategySet(
        strategies=[(s, round(c * fraction)) for s, c in strategy_set.strategies],
        max_len=strategy_set.max_len,
        max_depth=strategy_set.max_depth,
        algorithm=strategy_set.algorithm,
        histogram_checksum=strategy_set.histogram_checksum,
    )


@dataclasses.dataclass
class _Source:
    """Where a host's examples come from, and how to read one epoch of them."""

    files: list[str]
    shard: tuple[int, int]
    max_seq_length: int
    max_predictions_per_seq: int
    read_batch: int = 1024

    def read_all(self) -> ExampleTable:
        return records.read_table(
            self.files, self.max_seq_length, self.max_predictions_per_seq, shard=self.shard
        )

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


def _concatenate(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _windows(tables: Iterator[ExampleTable], size: int) -> Iterator[ExampleTable]:
    """Regroup a stream of tables into tables of ``size`` rows (the last may be smaller)."""
    pending: list[ExampleTable] = []
    count = 0
    for table in tables:
        pending.append(table)
        count += len(table)
        while count >= size:
            merged = ExampleTable.concatenate(pending)
            yield merged.select(np.arange(size))
            rest = merged.select(np.arange(size, count))
            pending, count = [rest], count - size
    if count:
        yield ExampleTable.concatenate(pending)


def _strategy_packs(
    table: ExampleTable, strategy_set: packing.StrategySet, seed: int
) -> list[list[int]]:
    """Packs of ``table`` rows, in an order random with ``seed``."""
    assignment = packing.assign_sequences(
        table.lengths, scale_strategies(strategy_set, len(table)), seed=seed
    )
    return assignment.packs


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


def pack_stats(
    data_dir: str,
    *,
    split: str = "train",
    strategies: str | packing.StrategySet | None = None,
    max_sequences_per_pack: int = 3,
    process_index: int = 0,
    process_count: int = 1,
    seed: int = 0,
    algorithm: str = "nnlshp",
) -> dict[str, float]:
    """What one epoch of ``packed_dataset`` (in-memory strategy mode) gives this host, without
    building rows: rows, sequences, fallback rows, achieved vs predicted efficiency, packing
    factor (e.g. to size steps per epoch)."""
    data = PreparedData.load(data_dir)
    L, M = data.max_seq_length, data.max_predictions_per_seq
    files, shard = host_share(records.find_shards(data_dir, split), process_index, process_count)
    lengths = records.read_table(files, L, M, shard=shard).lengths
    strategy_set = load_strategies(data_dir, strategies, L, max_sequences_per_pack, algorithm)
    assignment = packing.assign_sequences(
        lengths, scale_strategies(strategy_set, len(lengths)), seed=seed
    )
    rows = len(assignment.packs)
    return {
        "sequences": len(lengths),
        "rows": rows,
        "fallback_rows": assignment.fallback_packs,
        "packing_factor": len(lengths) / max(1, rows),
        "achieved_efficiency": 100.0 * float(lengths.sum()) / max(1, rows * L),
        "predicted_efficiency": float(strategy_set.metrics().efficiency),
        "padded_efficiency": 100.0 * float(lengths.sum()) / max(1, len(lengths) * L),
    }


def packed_dataset(
    data_dir: str,
    *,
    split: str = "train",
    batch_size: int,
    packed: bool = True,
    strategies: str | packing.StrategySet | None = None,
    max_sequences_per_pack: int = 3,
    max_predictions_per_pack: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    repeat: bool = True,
    process_index: int | None = None,
    process_count: int | None = None,
    streaming: bool = False,
    drop_remainder: bool = True,
    pack_window: int | None = None,
    shuffle_buffer: int = 16384,
    online_buffer_size: int = 256,
    algorithm: str = "nnlshp",
    prefetch: int = 2,
    start_batch: int = 0,
) -> tf.data.Dataset:
    """Batches of packed rows, exactly the packed-batch contract (see module docstring).

    Args:
      data_dir: output of ``create_pretraining_data`` (shards, histogram.txt, summary.json).
      batch_size: rows per batch on this host.
      packed: False gives the padded baseline (one sequence per row, D = 1).
      strategies: a StrategySet or a strategies.json path (default DIR/strategies.json, solved
        with ``algorithm`` from histogram.txt if missing).
      max_sequences_per_pack: D, the sequence slots per row.
      max_predictions_per_pack: P; default a bound no pack can exceed (see
        ``contract.max_predictions_per_pack``); a pack over an explicit P raises.
      shuffle, seed: shuffle files, examples within each length, and pack order, per epoch.
      repeat: loop over epochs forever (rows flow across epoch boundaries).
      process_index, process_count: this host's share (default jax.process_index()/count()).
      streaming: pack on the fly with packing.OnlinePacker (no strategies, bounded memory).
      drop_remainder: drop the last partial batch (only matters with repeat=False).
      pack_window: assign strategies over windows of this many examples (bounded memory)
        instead of the whole host split.
      shuffle_buffer: record shuffle buffer when streaming or windowed.
      online_buffer_size: open packs of the online packer.
      start_batch: begin where a stream that had already yielded this many batches stands
        (resume). The position is computed, not replayed: in memory from one epoch's pack
        count; streaming or windowed by reading and counting packs without building rows.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    if max_sequences_per_pack < 1:
        raise ValueError(f"max_sequences_per_pack must be >= 1, got {max_sequences_per_pack}.")
    if start_batch < 0:
        raise ValueError(f"start_batch must be >= 0, got {start_batch}.")
    data = PreparedData.load(data_dir)
    L, M = data.max_seq_length, data.max_predictions_per_seq
    shape = data.row_shape(max_sequences_per_pack, packed=packed)
    if max_predictions_per_pack:
        shape = dataclasses.replace(shape, max_predictions_per_pack=max_predictions_per_pack)
    D, P = shape.max_sequences_per_pack, shape.max_predictions_per_pack
    if process_index is None or process_count is None:
        import jax  # only to learn this host's place; the pipeline itself is TF + numpy

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    files, shard = host_share(records.find_shards(data_dir, split), process_index, process_count)
    source = _Source(files, shard, L, M)
    strategy_set = None
    if packed and not streaming:
        strategy_set = load_strategies(data_dir, strategies, L, D, algorithm)
    in_memory = pack_window is None and not streaming
    table = source.read_all() if in_memory else None
    if table is not None and len(table) == 0:
        raise ValueError(f"Host {process_index} of {process_count} has no {split} examples.")
    if table is not None and table.num_predictions.max() > P:
        raise ValueError(
            f"An example has {table.num_predictions.max()} masked positions, more than "
            f"max_predictions_per_pack={P}; raise it (or leave it None to derive a safe bound)."
        )

    def epoch_batches(epoch: int) -> Iterator[tuple[ExampleTable, list[list[int]]]]:
        # Without shuffling every epoch packs the same way (the seed still fixes which examples
        # of equal length share a row); with it, each epoch (and host) draws a new order.
        key = [seed, epoch if shuffle else 0, process_index]
        epoch_seed = int(np.random.SeedSequence(key).generate_state(1)[0])
        if in_memory:
            windows: Iterator[ExampleTable] = iter([table])
        else:
            windows = source.stream(shuffle, epoch_seed, shuffle_buffer)
        if packed and streaming:
            yield from _online_packs(windows, shape, online_buffer_size, batch_size)
            return
        if pack_window is not None:
            windows = _windows(windows, pack_window)
        for w, window in enumerate(windows):
            window_seed = epoch_seed + w
            if packed:
                yield window, _strategy_packs(window, strategy_set, window_seed)
            else:
                order = np.arange(len(window))
                if shuffle:
                    np.random.default_rng(window_seed).shuffle(order)
                yield window, [[int(i)] for i in order]

    def start_position() -> tuple[int, int, int | None]:
        """(epoch, packs to drop in it, packs per epoch) of row `start_batch * batch_size`.

        In memory every epoch holds the same number of packs (the same lengths, reshuffled),
        so the position is computed from one epoch's assignment; streaming or windowed, the
        epoch is not known in advance and its packs are counted as they are read (no rows
        are built for them)."""
        rows = start_batch * batch_size
        if not in_memory or rows == 0:
            return 0, rows, None
        per_epoch = sum(len(packs) for _, packs in epoch_batches(0))
        if not repeat:
            return 0, rows, per_epoch
        epoch, offset = divmod(rows, per_epoch)
        return epoch, offset, per_epoch

    def generate() -> Iterator[dict[str, np.ndarray]]:
        pending: list[dict[str, np.ndarray]] = []  # rows of a batch not yet full
        pending_rows = 0
        epoch, to_skip, per_epoch = start_position()
        while True:
            epoch_packs = 0
            for window, packs in epoch_batches(epoch):
                epoch_packs += len(packs)
                dropped = min(to_skip, len(packs))
                packs, to_skip = packs[dropped:], to_skip - dropped
                i = 0
                while i < len(packs):  # rows flow across window and epoch boundaries
                    take = min(batch_size - pending_rows, len(packs) - i)
                    rows = build_rows(window, packs[i : i + take], shape)
                    i += take
                    if take == batch_size:
                        yield rows
                        continue
                    pending.append(rows)
                    pending_rows += take
                    if pending_rows == batch_size:
                        yield _concatenate(pending)
                        pending, pending_rows = [], 0
            if epoch_packs == 0:
                raise ValueError(f"Host {process_index}/{process_count} has no {split} examples.")
            if per_epoch is not None and epoch_packs != per_epoch:
                raise RuntimeError(
                    f"Epoch {epoch} made {epoch_packs} packs, not {per_epoch}: the resume "
                    "position computed for start_batch would be wrong."
                )
            epoch += 1
            if not repeat:
                break
        if pending_rows and not drop_remainder:
            yield _concatenate(pending)

    signature = dataset_spec(shape, batch_size if drop_remainder or repeat else None)
    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return dataset.prefetch(prefetch)
