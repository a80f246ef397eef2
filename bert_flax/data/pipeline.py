"""The packed tf.data input pipeline: pre-training records -> fixed-shape packed batches.

    ds = packed_dataset("/tmp/sotu128", batch_size=32)          # packed, D = 3
    batch = next(ds.as_numpy_iterator())                         # bert_flax.data.contract
    base = packed_dataset("/tmp/sotu128", batch_size=32, packed=False)   # padded, D = 1

How rows are made (``packed=True``, the default):

1. Each host takes its share of the split's records (whole shards when their number divides
   evenly, otherwise every ``process_count``-th record). The record index
   (``record_index.RecordIndex``: file, byte offset, size, tokens and masked positions of every
   record, 18 bytes each) says where each one is, so nothing has to be read to plan an epoch.
2. Per epoch the host's records are cut into windows of ``pack_window`` examples (blocks of
   consecutive records in a random order; a split that fits is one window, read once and kept).
   Per window, ``packing.assign_sequences`` maps example indices to packs following the
   strategies (``strategies.json`` scaled to the window; solved from ``histogram.txt`` if
   missing), random within each length; examples the strategies do not cover go to the
   fallback packer at depth D, none are dropped. Memory: one or two windows and the index.
3. A resumed stream starts at its position, computed from the index's lengths
   (``packing.count_packs`` per window), never by replaying batches.
4. The pack order is shuffled; batches of packs become rows by one vectorized numpy gather
   (``rows.build_rows``) on ``workers`` threads of tf.data's parallel map, in a deterministic order.

``streaming=True`` packs on the fly with ``packing.OnlinePacker`` (bounded memory, no strategies,
no index; resume counts packs by reading);
``packed=False`` gives one example per row with the same features (D = 1).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

import packing
from bert_flax.data import records
from bert_flax.data.contract import (
    PRETRAINING_FEATURES,
    PreparedData,
    RowShape,
    feature_dtype,
    load_strategies,
)
from bert_flax.data.record_index import RecordIndex
from bert_flax.data.records import ExampleTable
from bert_flax.data.rows import build_rows, epoch_seed


def dataset_spec(shape: RowShape, batch_size: int | None) -> dict[str, tf.TensorSpec]:
    """The element spec of ``packed_dataset``: every feature of the contract, batch dim first."""
    return {
        name: tf.TensorSpec(
            (batch_size, *shape.feature_shape(name)), tf.as_dtype(feature_dtype(name)), name=name
        )
        for name in PRETRAINING_FEATURES
    }


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


DEFAULT_PACK_WINDOW = 1 << 16  # examples per window once a host's split is larger
SHUFFLE_BLOCK = 1024  # consecutive records read together; a window is a random set of blocks


def host_records(index: RecordIndex, files: Sequence[str], shard: tuple[int, int]) -> np.ndarray:
    """This host's record numbers, in file order (``host_share``'s files and record shard)."""
    names = {os.path.basename(f) for f in files}
    mine = np.flatnonzero(np.isin(np.asarray(index.files), sorted(names))[index.file_ids])
    return mine[shard[0] :: shard[1]]


def epoch_windows(host: np.ndarray, window: int, shuffle: bool, seed: int) -> list[np.ndarray]:
    """The host's records cut into windows of about ``window`` records: blocks of consecutive
    records (each one read) in an order random with ``seed``; each window's records sorted."""
    if len(host) <= window:
        return [host]
    block = max(1, min(SHUFFLE_BLOCK, window))
    blocks = [host[i : i + block] for i in range(0, len(host), block)]
    order = np.random.default_rng(seed).permutation(len(blocks)) if shuffle else range(len(blocks))
    order = list(order)
    per_window = max(1, window // block)
    return [
        np.sort(np.concatenate([blocks[b] for b in order[i : i + per_window]]))
        for i in range(0, len(order), per_window)
    ]


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """One window of an epoch: the records it packs (its own plus those the previous window
    carried over, minus those it carries on), the window size the strategies are scaled to,
    the packer of the sequences they leave (if it carries none on), and how many packs it
    makes."""

    records: np.ndarray
    scale_to: int
    packs: int
    fallback: str = "spfhp"


# A window carries at most this fraction of its examples over to the next one (beyond it, all
# its leftovers go to the fallback packer at once, CAPPED_FALLBACK); the last window of an epoch
# packs what is left with FINAL_FALLBACK (near-optimal, a fraction of a second at 512).
MAX_CARRY_FRACTION = 0.25
CAPPED_FALLBACK = "lpfhp"
FINAL_FALLBACK = "lp"


def epoch_plan(
    windows: Sequence[np.ndarray], lengths: np.ndarray, strategy_set: packing.StrategySet
) -> list[WindowPlan]:
    """What each window of an epoch packs, from the lengths alone (``lengths[r]`` of record r).

    Examples a window's strategies cannot place are carried over to the next window (where they
    meet new partners) instead of being packed by the fallback at once; the last window packs
    whatever is left. Which examples a window carries is fixed by the lengths (of each length,
    the highest record numbers), so the plan, and with it any stream position, is computed
    without running the seeded assignment, let alone reading an example."""
    plan, carried = [], np.zeros(0, np.int64)
    max_len = strategy_set.max_len
    for w, own in enumerate(windows):
        ids = np.union1d(carried, own)
        scaled = scale_strategies(strategy_set, len(ids))
        counts = np.bincount(lengths[ids], minlength=max_len + 1)
        last = w == len(windows) - 1
        # The last window packs its leftovers (near-optimally); another carries them on unless
        # they are too many, and then packs them itself (its plan redone with that packer).
        planned, extra, leftover = packing.plan_packs(
            counts, scaled, fallback=FINAL_FALLBACK if last else "spfhp"
        )
        made = sum(n for _, n in planned)
        capped = not last and leftover.sum() > MAX_CARRY_FRACTION * len(ids)
        if capped:
            _, extra, _ = packing.plan_packs(counts, scaled, fallback=CAPPED_FALLBACK)
        if last or capped:
            packer = FINAL_FALLBACK if last else CAPPED_FALLBACK
            plan.append(WindowPlan(ids, len(ids), made + sum(n for _, n in extra), packer))
            carried = np.zeros(0, np.int64)
            continue
        carried = _highest_of_each_length(ids, lengths[ids], leftover)
        plan.append(WindowPlan(np.setdiff1d(ids, carried), len(ids), made))
    return plan


def _highest_of_each_length(ids: np.ndarray, lengths: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Of ``ids`` (with ``lengths``), the ``count[k]`` highest of each length k."""
    order = np.lexsort((ids, lengths))
    ends = np.searchsorted(lengths[order], np.arange(len(count)), side="right")
    picked = [order[ends[k] - count[k] : ends[k]] for k in np.flatnonzero(count)]
    return np.sort(ids[np.concatenate(picked)]) if picked else np.zeros(0, np.int64)


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


def _epoch_seeds(seed: int, shuffle: bool, process_index: int) -> Callable[[int], int]:
    """epoch -> that epoch's seed. Without shuffling every epoch packs the same way (the seed
    still fixes which examples of equal length share a row); with it, each epoch (and host)
    draws a new order."""
    return lambda epoch: epoch_seed(seed, epoch if shuffle else 0, process_index)


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
    pack_window: int | None = None,
) -> dict[str, float]:
    """What the first epoch of ``packed_dataset`` (strategy mode, shuffled) gives this host,
    from the record index alone (no example is read): rows, sequences, windows, achieved vs
    predicted efficiency, packing factor (e.g. to size steps per epoch)."""
    data = PreparedData.load(data_dir)
    L = data.max_seq_length
    index = RecordIndex.load_or_build(data_dir, split)
    files, shard = host_share(records.find_shards(data_dir, split), process_index, process_count)
    host = host_records(index, files, shard)
    strategy_set = load_strategies(data_dir, strategies, L, max_sequences_per_pack, algorithm)
    windows = epoch_windows(
        host, pack_window or DEFAULT_PACK_WINDOW, True, epoch_seed(seed, 0, process_index)
    )
    rows = sum(window.packs for window in epoch_plan(windows, index.lengths, strategy_set))
    lengths = index.lengths[host]
    return {
        "sequences": len(lengths),
        "rows": rows,
        "windows": len(windows),
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
    workers: int = 2,
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
      shuffle, seed: shuffle windows, examples within each length, and pack order, per epoch.
      repeat: loop over epochs forever (rows flow across epoch boundaries).
      process_index, process_count: this host's share (default jax.process_index()/count()).
      streaming: pack on the fly with packing.OnlinePacker (no strategies, no record index).
      drop_remainder: drop the last partial batch (only matters with repeat=False).
      pack_window: examples per window (default ``DEFAULT_PACK_WINDOW``): a host's split up to
        this size is one window, kept in memory across epochs; a larger one is read a window at
        a time (memory bounded by the window, not the split).
      shuffle_buffer: record shuffle buffer when streaming.
      online_buffer_size: open packs of the online packer.
      start_batch: begin where a stream that had already yielded this many batches stands
        (resume). The position is computed from the record index's lengths (packs counted per
        window, nothing read or built); streaming, by reading and counting packs.
      workers: threads building rows (tf.data's parallel map; the order stays deterministic).
    """
    # Long for its 21 documented arguments; the body composes EpochPlanner (or the online
    # packer), the batch descriptors and the tf.data adapter.
    _check_arguments(batch_size, max_sequences_per_pack, start_batch, workers, pack_window)
    data = PreparedData.load(data_dir)
    L, M = data.max_seq_length, data.max_predictions_per_seq
    shape = data.row_shape(max_sequences_per_pack, packed=packed)
    if max_predictions_per_pack:
        shape = dataclasses.replace(shape, max_predictions_per_pack=max_predictions_per_pack)
    if process_index is None or process_count is None:
        import jax  # only to learn this host's place; the pipeline itself is TF + numpy

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    files, shard = host_share(records.find_shards(data_dir, split), process_index, process_count)
    tables = _LiveTables()
    start_rows = start_batch * batch_size
    where = f"Host {process_index} of {process_count}"
    if streaming:
        pairs = functools.partial(
            _online_pairs,
            _Source(files, shard, L, M),
            shape,
            tables,
            start_rows=start_rows,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            buffer_size=online_buffer_size,
            batch_size=batch_size,
            repeat=repeat,
            epoch_seed=_epoch_seeds(seed, shuffle, process_index),
            empty=f"{where} has no {split} examples.",
        )
    else:
        index = RecordIndex.load_or_build(data_dir, split)
        host = host_records(index, files, shard)
        _check_host_records(index, host, shape, f"{where} has no {split} examples.", split)
        strategy_set = (
            load_strategies(data_dir, strategies, L, shape.max_sequences_per_pack, algorithm)
            if packed
            else None
        )
        planner = EpochPlanner(
            index.lengths,
            host,
            pack_window or DEFAULT_PACK_WINDOW,
            strategy_set,
            shuffle,
            _epoch_seeds(seed, shuffle, process_index),
        )
        read = functools.partial(index.read, max_seq_length=L, max_predictions=M, data_dir=data_dir)
        pairs = functools.partial(_planned_pairs, planner, read, tables, start_rows, repeat)

    def descriptors() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return _batch_descriptors(pairs(), tables, shape, batch_size, drop_remainder)

    spec = dataset_spec(shape, batch_size if drop_remainder or repeat else None)
    return _rows_dataset(descriptors, tables, shape, spec, workers).prefetch(prefetch)


def _check_arguments(
    batch_size: int,
    max_sequences_per_pack: int,
    start_batch: int,
    workers: int,
    pack_window: int | None,
) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    if max_sequences_per_pack < 1:
        raise ValueError(f"max_sequences_per_pack must be >= 1, got {max_sequences_per_pack}.")
    if start_batch < 0:
        raise ValueError(f"start_batch must be >= 0, got {start_batch}.")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}.")
    if pack_window is not None and pack_window < 1:
        raise ValueError(f"pack_window must be >= 1 (or None for the default), got {pack_window}.")


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


@dataclasses.dataclass(frozen=True)
class EpochPlanner:
    """A host's records -> windows -> packs, epoch by epoch, from the records' lengths alone;
    and the position of a row in that stream as (epoch, window, packs into the window).

    ``strategy_set`` None plans the padded layout (one example a row, shuffled per window)."""

    lengths: np.ndarray  # tokens of every record of the split (the record index's)
    host: np.ndarray  # this host's record numbers
    window: int  # examples per window
    strategy_set: packing.StrategySet | None
    shuffle: bool
    epoch_seed: Callable[[int], int]

    def plan(self, epoch: int) -> list[WindowPlan]:
        windows = epoch_windows(self.host, self.window, self.shuffle, self.epoch_seed(epoch))
        if self.strategy_set is not None:
            return epoch_plan(windows, self.lengths, self.strategy_set)
        return [WindowPlan(ids, len(ids), len(ids)) for ids in windows]

    def packs(self, window: WindowPlan, window_seed: int) -> list[list[int]]:
        """Packs of rows of the window's table (``window.records``, in that order)."""
        if self.strategy_set is not None:
            scaled = scale_strategies(self.strategy_set, window.scale_to)
            lengths = self.lengths[window.records]
            return packing.assign_sequences(
                lengths, scaled, seed=window_seed, fallback=window.fallback
            ).packs
        order = np.arange(len(window.records))
        if self.shuffle:
            np.random.default_rng(window_seed).shuffle(order)
        return [[int(i)] for i in order]

    def position(self, rows: int, repeat: bool) -> tuple[int, int, int]:
        """(epoch, window, packs to drop in it) of row number ``rows`` of the stream, from the
        plans alone (nothing read, nothing assigned). Past the end without ``repeat``: the
        first window of the epoch after the last."""
        epoch = 0
        if rows == 0:
            return 0, 0, 0
        while True:
            plan = self.plan(epoch)
            if len(plan) == 1 and repeat:  # every epoch the same count: skip them at once
                epoch, rows = epoch + rows // plan[0].packs, rows % plan[0].packs
            for w, window in enumerate(plan):
                if rows < window.packs:
                    return epoch, w, rows
                rows -= window.packs
            epoch += 1
            if not repeat:
                return epoch, 0, 0

    def windows(
        self, start_rows: int, repeat: bool
    ) -> Iterator[tuple[list[WindowPlan], int, list]]:
        """(the epoch's plan, window number, its packs) from row ``start_rows`` on."""
        epoch, first_window, to_skip = self.position(start_rows, repeat)
        while repeat or epoch == 0:
            plan = self.plan(epoch)
            for w in range(first_window, len(plan)):
                packs = self.packs(plan[w], self.epoch_seed(epoch) + w)
                if len(packs) != plan[w].packs:
                    raise RuntimeError(f"Window {w} of epoch {epoch} broke its plan.")
                yield plan, w, packs[to_skip:]
                to_skip = 0
            first_window = 0
            epoch += 1


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
    *,
    start_rows: int,
    shuffle: bool,
    shuffle_buffer: int,
    buffer_size: int,
    batch_size: int,
    repeat: bool,
    epoch_seed: Callable[[int], int],
    empty: str,
) -> Iterator[tuple[int, list[list[int]]]]:
    """(table serial, packs) from the online packer; resume counts packs as they come."""
    to_skip, epoch = start_rows, 0
    while True:
        made = 0
        stream = source.stream(shuffle, epoch_seed(epoch), shuffle_buffer)
        for table, packs in _online_packs(stream, shape, buffer_size, batch_size):
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
        if not repeat:
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
