"""Writes scalar metrics to a JSON-lines file and TensorBoard (process 0 only).

`workdir/metrics.jsonl` holds one object per (split, step): `{"split": "train", "step": 100,
"mlm_loss": ...}`; `workdir/tensorboard/` holds the same under `split/name` tags. A resumed run
appends; readers keep the last record per (split, step) (`read_metrics`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import jax

METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    def __init__(self, workdir: str, *, enabled: bool | None = None, tensorboard: bool = True):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = os.path.join(workdir, METRICS_FILE)
        self._tb = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            if tensorboard:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, split: str, step: int, scalars: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        record = {"split": split, "step": int(step), **{k: _plain(v) for k, v in scalars.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for name, value in scalars.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(f"{split}/{name}", value, step)
            self._tb.flush()

    def write_text(self, tag: str, text: str) -> None:
        if self.enabled and self._tb is not None:
            self._tb.add_text(tag, text, 0)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_metrics(workdir: str) -> dict[str, list[dict[str, Any]]]:
    """Records per split sorted by step, the last one winning where a resumed run repeated it."""
    path = os.path.join(workdir, METRICS_FILE)
    by_key: dict[tuple[str, int], dict[str, Any]] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    by_key[(record["split"], record["step"])] = record
    out: dict[str, list[dict[str, Any]]] = {}
    for (split, _), record in sorted(by_key.items()):
        out.setdefault(split, []).append(record)
    return out
