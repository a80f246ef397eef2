"""One row builder for every task: packs of examples -> rows of the packed-batch contract, and
the epochs of batches of a fine-tuning task's table of examples.

    rows = build_rows(examples, [[4, 0], [2]], RowShape(128, 3, 22))   # two rows, D = 3
    for batch in batches(examples, batch_size=32, max_seq_length=128, max_sequences_per_pack=8):
        ...

A pack is a list of example indices; its examples sit one after another in the row. The core
fields (`contract.CORE_FEATURES`: tokens, segment ids 1..k, positions restarting at 0, each
example's [CLS] index, the slot mask) are built here by one vectorized numpy gather for the whole
batch; `examples` (the task's table: `records.ExampleTable` for pre-training, `EncodedSplit` for
classification, `WindowTable` for question answering) supplies its tokens and its own per-slot
features.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

import packing
from bert_flax.input_pipeline.contract import RowShape


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Where the examples of B packs sit in rows of D slots (arrays [B, D])."""

    source: np.ndarray  # example index of each slot (0 for an empty slot)
    valid: np.ndarray  # whether the slot holds an example
    starts: np.ndarray  # row index of the slot's first token (its [CLS]); 0 when empty

    def per_slot(self, values: np.ndarray) -> np.ndarray:
        """`values[example]` at each slot, 0 for an empty slot."""
        return np.where(self.valid, values[self.source], 0)

    def spread(self, counts: np.ndarray, width: int):
        """Lays the slots' `counts` [B, D] out one slot after another over `width` columns.

        Returns (slot, example, offset, real), each [B, width]: column j's slot, that slot's
        example, j's index inside the slot's run, and whether j is inside any run.
        """
        ends = np.cumsum(counts, axis=1)
        j = np.arange(width)
        last = counts.shape[1] - 1
        slot = np.minimum((j[None, None, :] >= ends[:, :, None]).sum(axis=1), last)
        real = j[None, :] < ends[:, -1:]
        row = np.arange(len(counts))[:, None]
        offset = np.where(real, j[None, :] - (ends - counts)[row, slot], 0)
        return slot, self.source[row, slot], offset, real


class Examples(Protocol):
    """A task's table of examples, as `build_rows` reads it."""

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example [N]."""

    def __len__(self) -> int: ...

    def tokens(self, example: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, token_type_ids) of token `position` of `example` (index arrays)."""

    def task_features(self, layout: RowLayout, shape: RowShape) -> dict[str, np.ndarray]:
        """The task's features of the rows (contract: its feature set beyond the core)."""


def layout_packs(packs: Sequence[Sequence[int]], lengths: np.ndarray, depth: int) -> RowLayout:
    """The `RowLayout` of `packs` (lists of example indices; an empty list is an empty row)."""
    slots = np.full((len(packs), depth), -1, dtype=np.int64)
    for r, pack in enumerate(packs):
        if len(pack) > depth:
            raise ValueError(f"A pack holds {len(pack)} sequences, more than D={depth}.")
        slots[r, : len(pack)] = pack
    if np.any(slots >= len(lengths)):
        raise ValueError(f"A pack names example {slots.max()}, but there are {len(lengths)}.")
    valid = slots >= 0
    source = np.where(valid, slots, 0)
    sizes = np.where(valid, lengths[source], 0)
    starts = np.where(valid, np.cumsum(sizes, axis=1) - sizes, 0)
    return RowLayout(source=source, valid=valid, starts=starts)


def build_rows(
    examples: Examples, packs: Sequence[Sequence[int]], shape: RowShape
) -> dict[str, np.ndarray]:
    """Rows of the contract (core fields + `examples`' task features) for `packs`."""
    L = shape.max_seq_length
    layout = layout_packs(packs, examples.lengths, shape.max_sequences_per_pack)
    lengths = layout.per_slot(examples.lengths)
    if np.any(lengths.sum(axis=1) > L):
        raise ValueError(f"A pack holds {lengths.sum(axis=1).max()} tokens, more than L={L}.")
    slot, example, position, real = layout.spread(lengths, L)
    input_ids, token_type_ids = examples.tokens(example, position)
    int32 = lambda x: np.asarray(x, np.int32)
    return {
        "input_ids": int32(np.where(real, input_ids, 0)),
        "token_type_ids": int32(np.where(real, token_type_ids, 0)),
        "segment_ids": int32(np.where(real, slot + 1, 0)),
        "positions": int32(position),
        "cls_positions": int32(layout.starts),
        "sequence_mask": layout.valid.astype(np.float32),
        **examples.task_features(layout, shape),
    }


def epoch_seed(seed: int, epoch: int, process_index: int = 0) -> int:
    """The packing and ordering seed of one epoch on one host."""
    return int(np.random.SeedSequence([seed, epoch, process_index]).generate_state(1)[0])


def pack_examples(
    lengths: np.ndarray,
    max_seq_length: int,
    max_sequences_per_pack: int,
    *,
    algorithm: str = "lpfhp",
    seed: int = 0,
    packed: bool = True,
) -> list[list[int]]:
    """Rows of example indices, every example exactly once, in an order random with ``seed``.

    Packed: the strategies ``algorithm`` solves on the histogram of ``lengths`` (as in
    pre-training), filled by ``packing.assign_sequences``; padded: one example per row.
    """
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        raise ValueError("There are no examples to pack.")
    if not packed:
        return [[int(i)] for i in np.random.default_rng(seed).permutation(lengths.size)]
    if max_sequences_per_pack < 1:
        raise ValueError(f"max_sequences_per_pack must be >= 1, got {max_sequences_per_pack}.")
    histogram = packing.from_lengths(lengths, max_seq_length)
    strategies = packing.pack_histogram(
        histogram, max_seq_length, algorithm=algorithm, max_depth=max_sequences_per_pack
    )
    return packing.assign_sequences(lengths, strategies, seed=seed).packs


def packing_factor(packs: Sequence[Sequence[int]]) -> float:
    """Examples per row."""
    return sum(len(p) for p in packs) / max(1, len(packs))


def batches(
    encoded: Examples,
    *,
    batch_size: int,
    max_seq_length: int,
    max_sequences_per_pack: int = 8,
    packed: bool = True,
    algorithm: str = "lpfhp",
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    pad_final: bool = False,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[dict[str, np.ndarray]]:
    """One epoch of batches of ``batch_size`` rows for this host.

    Packing and order use ``epoch_seed(seed, epoch)`` when ``shuffle``, else the same rows every
    epoch (padded: file order). Host ``process_index`` takes every ``process_count``-th row; all
    hosts yield the same number of batches. ``pad_final`` (evaluation, prediction) fills the last
    batch with empty rows so every example appears once; otherwise the last partial batch is
    dropped. Padded rows (``packed=False``) have D = 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is not in [0, {process_count}).")
    if len(encoded) == 0:
        raise ValueError("The split has no examples.")
    if encoded.lengths.max() > max_seq_length:
        raise ValueError(
            f"Examples of up to {encoded.lengths.max()} tokens do not fit rows of "
            f"{max_seq_length}; encode with max_seq_length={max_seq_length}."
        )
    slots = max_sequences_per_pack if packed else 1
    pack_seed = epoch_seed(seed, epoch if shuffle else 0)
    if packed or shuffle:
        packs = pack_examples(
            encoded.lengths,
            max_seq_length,
            slots,
            algorithm=algorithm,
            seed=pack_seed,
            packed=packed,
        )
    else:
        packs = [[i] for i in range(len(encoded))]
    mine = packs[process_index::process_count]
    if pad_final:
        count = -(-math.ceil(len(packs) / process_count) // batch_size)
        mine = mine + [[] for _ in range(count * batch_size - len(mine))]
    else:
        count = len(packs) // process_count // batch_size
        if count == 0:
            raise ValueError(
                f"{len(packs)} rows make no full batch of {batch_size} rows on each of "
                f"{process_count} hosts; lower batch_size or pass pad_final=True."
            )
    for b in range(count):
        yield build_rows(
            encoded, mine[b * batch_size : (b + 1) * batch_size], RowShape(max_seq_length, slots)
        )
