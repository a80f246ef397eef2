"""Host-side aggregation of train/eval metrics and the console progress line.

Steps return global sums and counts (`name/sum`, `name/count`) plus scalars; `summarize` turns
sums over any number of steps into means, and `Throughput` adds sequences/s, real tokens/s and
padding fraction for a wall-clock interval.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import jax
import numpy as np

# Scalars averaged over the steps of an interval (all others are summed).
AVERAGED = ("loss", "grad_norm", "learning_rate")
COUNTERS = ("rows", "sequences", "real_tokens", "tokens", "masked_tokens")


def sum_metrics(steps: Iterable[Mapping[str, jax.Array]]) -> dict[str, float]:
    """Fetches per-step metrics from the devices and adds them up (keeps `steps` for means)."""
    fetched = jax.device_get(list(steps))
    total: dict[str, float] = {"steps": float(len(fetched))}
    for metrics in fetched:
        for name, value in metrics.items():
            total[name] = total.get(name, 0.0) + float(np.asarray(value))
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


def progress_line(step: int, total_steps: int, summary: Mapping[str, float]) -> str:
    """`step 120/600 (20%) | loss 6.12 | mlm_acc 0.121 | 812 seq/s | 61k tok/s | ETA 2m03s`."""
    remaining = (total_steps - step) * summary.get("step_seconds", 0.0)
    parts = [
        f"step {step}/{total_steps} ({100.0 * step / total_steps:.0f}%)",
        f"loss {summary.get('loss', float('nan')):.4f}",
        f"mlm_loss {summary.get('mlm_loss', float('nan')):.4f}",
        f"mlm_acc {summary.get('mlm_accuracy', float('nan')):.3f}",
        f"lr {summary.get('learning_rate', 0.0):.2e}",
        f"{summary.get('sequences_per_second', 0.0):,.0f} seq/s",
        f"{summary.get('real_tokens_per_second', 0.0) / 1e3:,.1f}k tok/s",
        f"ETA {format_seconds(remaining)}",
    ]
    return " | ".join(parts)


def format_seconds(seconds: float) -> str:
    seconds = round(max(seconds, 0.0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
