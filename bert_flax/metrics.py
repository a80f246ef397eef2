"""Training metrics on the host: aggregation, the console progress line, and where they are written.

Steps return global sums and counts (`name/sum`, `name/count`) plus scalars; `summarize` turns
sums over any number of steps into means, and `Throughput` adds sequences/s, real tokens/s and
padding fraction for a wall-clock interval; `side_by_side_rates` times several train steps
alternately, so that the load of a shared machine hits them alike. `MetricsWriter` (process 0
only) appends them to `workdir/metrics.jsonl`, one object per (split, step): `{"split":
"train", "step": 100, "mlm_loss": ...}`, and to TensorBoard under `workdir/tensorboard/` as
`split/name`; a resumed run appends, and `read_metrics` keeps the last record per (split, step).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"

# Scalars averaged over the steps of an interval (all others are summed).
AVERAGED = ("loss", "grad_norm", "learning_rate")


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


def progress_line(
    step: int,
    total_steps: int,
    summary: Mapping[str, float],
    host: Mapping[str, float] | None = None,
) -> str:
    """`step 120/600 (20%) | loss 6.12 | mlm_acc 0.121 | 812 seq/s | 61k tok/s | ETA 2m03s`,
    then the optimizer's host metrics (`shampoo/staleness 3`, ...) if any."""
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


def side_by_side_rates(
    setups: Mapping[str, Any], batches: Mapping[str, list], *, rounds: int, steps: int
) -> dict[str, float]:
    """Median sequences per second of each setup's train step (a `TrainSetup`) on its
    `batches` (global, sharded), the setups taking turns every `steps` steps for `rounds`
    rounds after a round that compiles and warms up."""
    states = {name: setup.state for name, setup in setups.items()}
    rates: dict[str, list[float]] = {name: [] for name in setups}
    rng = jax.random.key(0)
    for round_index in range(rounds + 1):
        for name, setup in setups.items():
            for i in range(steps):
                batch = batches[name][i % len(batches[name])]
                start = time.perf_counter()
                states[name], metrics = setup.train_step(states[name], batch, rng)
                jax.block_until_ready(metrics)
                seconds = time.perf_counter() - start
                if round_index:
                    rates[name].append(float(metrics["sequences"]) / seconds)
    return {name: float(np.median(r)) for name, r in rates.items()}
