"""Each epoch of a host's records as windows and packs, planned from the records' lengths alone.

    epochs = EpochPlanner(index.lengths, host, window, strategy_set, shuffle, epoch_seeds(...))
    epochs.plan(0)                   # the first epoch's windows: records, packs, fallback packer
    epochs.position(rows, repeat)    # where row number `rows` of the stream stands, nothing read

Nothing here reads an example: `datasets` reads the planned windows and builds their rows.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np

import packing
from bert_flax.input_pipeline.record_index import RecordIndex
from bert_flax.input_pipeline.rows import epoch_seed


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


def epoch_seeds(seed: int, shuffle: bool, process_index: int) -> Callable[[int], int]:
    """epoch -> that epoch's seed. Without shuffling every epoch packs the same way (the seed
    still fixes which examples of equal length share a row); with it, each epoch (and host)
    draws a new order."""
    return lambda epoch: epoch_seed(seed, epoch if shuffle else 0, process_index)


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
