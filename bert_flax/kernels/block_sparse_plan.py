"""Index plans: nonzero blocks grouped by output column (or input row), padded per chunk.

The XLA path turns a block-sparse product into a few batched matmuls. Group the nonzero blocks
by the column they write (`by="out"`: forward and weight gradient) or by the row they read from
(`by="in"`: input gradient). Columns are sorted by their number of blocks and cut into chunks of
`chunk` columns; inside a chunk every column is padded to the chunk's largest count, so padding
stays small even for uneven layouts, and each chunk is one `dot_general` with a batch dimension.
Padding slots read source block 0 and a zero weight block (index `nnz`, filled with zeros).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the layout is the layer's; the kernels read its index arrays
    from bert_flax.block_sparse.layout import BlockSparseLayout


@dataclasses.dataclass(frozen=True, eq=False)
class Chunk:
    """`cols` [C]: the grouped columns; `src` [C, K]: the block rows each reads; `blk` [C, K]:
    which stored block (canonical index, `nnz` for padding) multiplies it."""

    cols: np.ndarray
    src: np.ndarray
    blk: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class GroupedPlan:
    chunks: tuple[Chunk, ...]
    inverse: np.ndarray  # position of each column in the concatenation of the chunks' columns
    valid: np.ndarray  # [nnz]: slot of canonical block n in the concatenated padded slots
    padded_slots: int

    @property
    def natural_order(self) -> bool:
        """One column per chunk, in column order: outputs need no reassembly."""
        return all(ch.cols.size == 1 for ch in self.chunks) and bool(
            np.all(self.inverse == np.arange(self.inverse.size))
        )

    @property
    def padding_overhead(self) -> float:
        """Padded slots / real blocks (1.0 means no padding)."""
        return self.padded_slots / self.valid.size


def _build(mask: np.ndarray, block_id: np.ndarray, chunk: int) -> GroupedPlan:
    counts = mask.sum(axis=0)
    # Sorting by count minimises padding; single-column chunks need none and keep natural order.
    order = np.arange(counts.size) if chunk == 1 else np.argsort(-counts, kind="stable")
    nnz = int(mask.sum())
    chunks, valid, slot = [], np.empty(nnz, np.int64), 0
    for start in range(0, order.size, chunk):
        cols = order[start : start + chunk]
        k = max(1, int(counts[cols].max()))
        src = np.zeros((cols.size, k), np.int32)
        blk = np.full((cols.size, k), nnz, np.int32)
        for c, col in enumerate(cols):
            rows = np.flatnonzero(mask[:, col])
            src[c, : rows.size] = rows
            blk[c, : rows.size] = block_id[rows, col]
            valid[block_id[rows, col]] = slot + c * k + np.arange(rows.size)
        chunks.append(Chunk(cols.astype(np.int32), src, blk))
        slot += cols.size * k
    inverse = np.argsort(order).astype(np.int32)
    return GroupedPlan(tuple(chunks), inverse, valid.astype(np.int32), slot)


def grouped_plan(layout: BlockSparseLayout, by: str, chunk: int) -> GroupedPlan:
    """The (cached) plan grouping `layout`'s blocks by "out" columns or "in" rows."""
    if by not in ("out", "in"):
        raise ValueError(f"by must be 'out' or 'in'; got {by!r}.")

    def build() -> GroupedPlan:
        block_id = np.full(layout.mask.shape, -1, np.int64)
        block_id[layout.rows, layout.cols] = np.arange(layout.nnz)
        if by == "out":
            return _build(layout.mask, block_id, chunk)
        return _build(layout.mask.T, block_id.T, chunk)

    return layout.cached(("grouped_plan", by, chunk), build)


def default_chunk(
    layout: BlockSparseLayout,
    by: str,
    rows: int,
    itemsize: int,
    target_bytes: int,
    max_chunks: int,
) -> int:
    """Columns per chunk: one chunk's gathered operand is about `target_bytes`, and there are at
    most `max_chunks` chunks."""
    groups = layout.out_blocks if by == "out" else layout.in_blocks
    per_column = layout.nnz / groups * layout.block_size * max(rows, 1) * itemsize
    chunk = max(1, int(target_bytes // max(per_column, 1)), -(-groups // max_chunks))
    return min(chunk, groups)
