"""Training metrics on the host: aggregation, the console progress line, and where they are written.

Steps return global sums and counts (`name/sum`, `name/count`) plus scalars; `summarize` turns
sums over any number of steps into means, and `Throughput` adds sequences/s, real tokens/s and
padding fraction for a wall-clock interval; `side_by_side` times several setups' training steps
in turns, so that the load of a shared machine hits them alike. `MetricsWriter` (process 0
only) appends them to `workdir/metrics.jsonl`, one object per (split, step): `{"split":
"train", "step": 100, "mlm_loss": ...}`, and to TensorBoard under `workdir/tensorboard/` as
`split/name`; a resumed run appends, and `read_metrics` keeps the last record per (split, step).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"

# Scalars averaged over the steps of an interval, and those whose largest value is kept (all
# others are summed).
AVERAGED = ("loss", "grad_norm", "learning_rate")
MAXIMA = ("nonfinite_streak",)


def sum_metrics(steps: Iterable[Mapping[str, jax.Array]]) -> dict[str, float]:
    """Fetches per-step metrics from the devices and adds them up (keeps `steps` for means)."""
    fetched = jax.device_get(list(steps))
    total: dict[str, float] = {"steps": float(len(fetched))}
    for metrics in fetched:
        for name, value in metrics.items():
            value = float(np.asarray(value))
            if name in MAXIMA:
                total[name] = max(total.get(name, value), value)
            else:
                total[name] = total.get(name, 0.0) + value
    return total


def summarize(total: Mapping[str, float]) -> dict[str, float]:
    """Means from sums/counts: `mlm_loss`, `mlm_accuracy`, ...; scalars averaged over steps."""
    out: dict[str, float] = {}
    for name, value in total.items():
        if name.endswith("/sum"):
            base = name[: -len("/sum")]
            count = total.get(f"{base}/count", 0.0)
            out[base] = value / count if count else float("nan")
        elif name in AVERAGED:
            out[name] = value / max(total.get("steps", 1.0), 1.0)
        elif not name.endswith("/count"):
            out[name] = value
    if total.get("tokens"):
        out["padding_fraction"] = 1.0 - total["real_tokens"] / total["tokens"]
    if total.get("rows"):
        out["sequences_per_row"] = total["sequences"] / total["rows"]
    return out


class Throughput:
    """Rates over the wall-clock time since the last `measure`."""

    def __init__(self):
        self._last = time.perf_counter()

    def reset(self) -> None:
        self._last = time.perf_counter()

    def measure(self, total: Mapping[str, float]) -> dict[str, float]:
        now = time.perf_counter()
        seconds, self._last = max(now - self._last, 1e-9), now
        return {
            "step_seconds": seconds / max(total.get("steps", 1.0), 1.0),
            "sequences_per_second": total.get("sequences", 0.0) / seconds,
            "real_tokens_per_second": total.get("real_tokens", 0.0) / seconds,
        }


def progress_line(
    step: int,
    total_steps: int,
    summary: Mapping[str, float],
    host: Mapping[str, float] | None = None,
    shown: Sequence[str] = ("mlm_loss", "mlm_accuracy"),
) -> str:
    """`step 120/600 (20%) | loss 6.12 | mlm_loss 5.4 | mlm_accuracy 0.121 | lr 3.9e-03 |
    812 seq/s | 61k tok/s | ETA 2m03s` (the task's metrics `shown`), then the optimizer's host
    metrics (`shampoo/staleness 3`, ...) if any."""
    remaining = (total_steps - step) * summary.get("step_seconds", 0.0)
    parts = [
        f"step {step}/{total_steps} ({100.0 * step / total_steps:.0f}%)",
        f"loss {summary.get('loss', float('nan')):.4f}",
        *(f"{name} {summary.get(name, float('nan')):.4f}" for name in shown),
        f"lr {summary.get('learning_rate', 0.0):.2e}",
        f"{summary.get('sequences_per_second', 0.0):,.0f} seq/s",
        f"{summary.get('real_tokens_per_second', 0.0) / 1e3:,.1f}k tok/s",
        f"ETA {format_seconds(remaining)}",
    ]
    if summary.get("nonfinite_steps"):
        parts.append(f"{summary['nonfinite_steps']:.0f} non-finite steps skipped")
    parts += [f"{name} {value:.4g}" for name, value in (host or {}).items()]
    return " | ".join(parts)


def format_seconds(seconds: float) -> str:
    seconds = round(max(seconds, 0.0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


# -- Writing and reading -----------------------------------------------------------------------


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


def learning_curve(workdir: str, metric: str = "masked_lm_accuracy") -> dict[str, list[float]]:
    """A run's evaluations with what training had cost by then: `step`, `sequences_seen`,
    `train_seconds` (training steps only) and `metric`, one entry per evaluation."""
    records = read_metrics(workdir)
    train = {r["step"]: r for r in records.get("train", [])}
    curve: dict[str, list[float]] = {k: [] for k in ("step", "sequences_seen", "train_seconds")}
    curve[metric] = []
    for record in records.get("eval", []):
        seen = train.get(record["step"])
        if seen is None or metric not in record:
            continue
        curve["step"].append(record["step"])
        curve["sequences_seen"].append(seen["sequences_seen"])
        curve["train_seconds"].append(seen.get("train_seconds", float("nan")))
        curve[metric].append(record[metric])
    return curve
