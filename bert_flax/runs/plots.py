"""PNG plots of a run's workdir: loss, accuracy and (for real data) the packing report."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bert_flax.runs.metrics import read_metrics


def _series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    if not points:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*points)
    return np.asarray(steps), np.asarray(values, dtype=np.float64)


def plot_curves(workdir: str) -> list[str]:
    """`loss.png` (train MLM/NSP/total, eval MLM) and `accuracy.png` (train and eval masked-LM
    accuracy against the most-frequent-token baseline, NSP accuracy)."""
    metrics = read_metrics(workdir)
    train, evals = metrics.get("train", []), metrics.get("eval", [])
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (
        ("loss", "train total"),
        ("mlm_loss", "train MLM"),
        ("nsp_loss", "train NSP"),
    ):
        ax.plot(*_series(train, key), label=label)
    ax.plot(*_series(evals, "mlm_loss"), "o-", label="eval MLM")
    ax.set(xlabel="step", ylabel="loss", title="Pre-training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, workdir, "loss.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(*_series(train, "mlm_accuracy"), label="train masked-LM")
    ax.plot(*_series(evals, "masked_lm_accuracy"), "o-", label="eval masked-LM (MLPerf)")
    ax.plot(*_series(evals, "nsp_accuracy"), "s--", label="eval NSP")
    _, baseline = _series(evals, "baseline")
    if baseline.size:
        ax.axhline(baseline[-1], color="gray", ls=":", label="most frequent token")
    ax.set(xlabel="step", ylabel="accuracy", title="Accuracy", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, workdir, "accuracy.png"))
    return written


def plot_finetuning(workdir: str, metric: str, loss: str = "classification_loss") -> str:
    """`finetuning.png`: train and validation `loss`, and the validation `metric` against the
    baseline, per step."""
    metrics = read_metrics(workdir)
    train, evals = metrics.get("train", []), metrics.get("eval", [])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(*_series(train, loss), label="train")
    left.plot(*_series(evals, loss), "o-", label="validation")
    left.set(xlabel="step", ylabel="loss", title="Fine-tuning loss")
    left.legend()
    right.plot(*_series(evals, metric), "o-", label=f"validation {metric}")
    _, baseline = _series(evals, "baseline")
    if baseline.size:
        right.axhline(baseline[-1], color="gray", ls=":", label="baseline")
    right.set(xlabel="step", ylabel=metric, title=f"Validation {metric}")
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return _save(fig, workdir, "finetuning.png")


def plot_packing(data_dir: str, workdir: str) -> str | None:
    """`packing.png`: the train length histogram and how the strategies fill rows."""
    import packing
    from packing import histogram as packing_histogram

    hist_path = os.path.join(data_dir, "histogram.txt")
    strategies_path = os.path.join(data_dir, "strategies.json")
    if not (os.path.exists(hist_path) and os.path.exists(strategies_path)):
        return None
    hist = packing_histogram.load_histogram(hist_path)
    strategy_set = packing.StrategySet.load(strategies_path)
    m = strategy_set.metrics()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.bar(np.arange(hist.size), hist, width=1.0)
    left.set(xlabel="sequence length (tokens)", ylabel="sequences", title="Train lengths")
    left.set_yscale("log")
    depths: dict[int, int] = {}
    for lengths, count in strategy_set.strategies:
        depths[len(lengths)] = depths.get(len(lengths), 0) + count
    keys = sorted(depths)
    right.bar(keys, [depths[k] for k in keys])
    right.set_xticks(keys)
    right.set(xlabel="sequences per row", ylabel="rows", title="Packed rows")
    unpacked = 100.0 * float(m.real_tokens) / (float(m.sequences) * strategy_set.max_len)
    fig.suptitle(
        f"{strategy_set.algorithm}: packing factor {m.packing_factor:.3f}, efficiency "
        f"{m.efficiency:.1f}% (padded {unpacked:.1f}%), {m.packs:,} rows for {m.sequences:,} seqs"
    )
    return _save(fig, workdir, "packing.png")


def plot_run(workdir: str, data_dir: str | None = None) -> list[str]:
    """All plots of a run; returns the PNG paths."""
    written = plot_curves(workdir)
    if data_dir:
        path = plot_packing(data_dir, workdir)
        if path:
            written.append(path)
    return written


def plot_packed_vs_padded(
    curves: dict[str, dict[str, list[float]]],
    sequences_per_second: dict[str, float],
    baseline: float,
    path: str,
) -> str:
    """Eval masked-LM accuracy of several runs against training seconds and against sequences
    seen (`metrics.learning_curve`), the most-frequent-token baseline drawn, and their training
    sequences per second side by side (titled with the first over the last when there are two)."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [3, 3, 2]})
    for x_key, ax, title in (
        ("train_seconds", axes[0], "Learning against time"),
        ("sequences_seen", axes[1], "Learning per sequence"),
    ):
        for name, curve in curves.items():
            ax.plot(curve[x_key], curve["masked_lm_accuracy"], "o-", ms=3, label=name)
        ax.axhline(baseline, color="gray", ls=":", label="most frequent token")
        ax.set(xlabel=x_key.replace("_", " "), ylabel="eval masked-LM accuracy", title=title)
        ax.set_xlim(left=0.0)
        ax.set_ylim(bottom=0.0)
        ax.grid(alpha=0.3)
        ax.legend()
    names = list(sequences_per_second)
    rates = [sequences_per_second[k] for k in names]
    axes[2].bar(names, rates, color=[f"C{i}" for i in range(len(names))])
    title = f"Speed: {rates[0] / rates[-1]:.2f}x" if len(rates) == 2 else "Speed"
    axes[2].set(ylabel="training sequences / s", title=title)
    if len(names) > 2:
        plt.setp(axes[2].get_xticklabels(), rotation=30, ha="right")
    return _save(fig, os.path.dirname(path) or ".", os.path.basename(path))


def _save(fig, workdir: str, name: str) -> str:
    path = os.path.join(workdir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
