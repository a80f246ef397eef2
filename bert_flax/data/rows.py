"""One row builder for every task: packs of examples -> rows of the packed-batch contract.

    rows = build_rows(examples, [[4, 0], [2]], RowShape(128, 3, 22))   # two rows, D = 3

A pack is a list of example indices; its examples sit one after another in the row. The core
fields (`contract.CORE_FEATURES`: tokens, segment ids 1..k, positions restarting at 0, each
example's [CLS] index, the slot mask) are built here by one vectorized numpy gather for the whole
batch; `examples` (the task's table: `records.ExampleTable` for pre-training,
`classification.EncodedSplit` for fine-tuning) supplies its tokens and its own per-slot features.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from bert_flax.data.contract import RowShape


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
