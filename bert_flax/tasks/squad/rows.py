"""Windows into rows of the packed-batch contract (`bert_flax.input_pipeline.rows.build_rows`),
packed by the project's strategies on the windows' length histogram, or one a row (padded).

    table = WindowTable(windows)
    packs = pack_examples(table.lengths, 384, 3)
    batch = build_rows(table, packs, RowShape(384, 3))

Beyond the core fields, a row holds per slot `start_positions` / `end_positions` (row indices;
a window without the answer points at its own [CLS]) and `window_ids` (the window's index, -1
for an empty slot), and per token `context_mask` (1 where an answer may start or end).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.rows import RowLayout
from bert_flax.tasks.squad.reading import Window

QA_TASK_FEATURES = ("start_positions", "end_positions", "window_ids", "context_mask")


class WindowTable:
    """The `rows.Examples` table of a list of windows."""

    def __init__(self, windows: Sequence[Window]):
        if not windows:
            raise ValueError("There are no windows to make rows of.")
        self.windows = list(windows)
        self.lengths = np.array([len(w.input_ids) for w in windows], np.int64)
        self._first = np.cumsum(self.lengths) - self.lengths
        self._ids = np.concatenate([w.input_ids for w in windows])
        self._types = np.concatenate([w.type_ids for w in windows])
        self._context = np.concatenate([w.context_mask for w in windows])
        self._answers = np.array([(w.start, w.end) for w in windows], np.int64)

    def __len__(self) -> int:
        return len(self.windows)

    def tokens(self, example: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = self._first[example] + position
        return self._ids[flat], self._types[flat]

    def task_features(self, layout: RowLayout, shape: RowShape) -> dict[str, np.ndarray]:
        _, example, position, real = layout.spread(
            layout.per_slot(self.lengths), shape.max_seq_length
        )
        context = real & self._context[self._first[example] + position]
        start, end = (layout.starts + layout.per_slot(self._answers[:, i]) for i in (0, 1))
        return {
            "start_positions": start.astype(np.int32),
            "end_positions": end.astype(np.int32),
            "window_ids": np.where(layout.valid, layout.source, -1).astype(np.int32),
            "context_mask": context.astype(np.int32),
        }
