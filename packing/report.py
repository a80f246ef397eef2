"""Tables and plots of packing results."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packing.strategy_set import StrategySet

JSON_KEYS = (
    "algorithm",
    "max_len",
    "max_depth",
    "sequences",
    "packs",
    "real_tokens",
    "padding_tokens",
    "efficiency",
    "packing_factor",
    "max_packing_factor",
    "seconds",
)


def summary(strategies: StrategySet) -> dict:
    """The CLI's JSON record of one run (efficiency in percent)."""
    m = strategies.metrics()
    return {
        "algorithm": strategies.algorithm,
        "max_len": strategies.max_len,
        "max_depth": strategies.max_depth,
        "sequences": m.sequences,
        "packs": m.packs,
        "real_tokens": m.real_tokens,
        "padding_tokens": m.padding_tokens,
        "efficiency": round(m.efficiency, 4),
        "packing_factor": round(m.packing_factor, 4),
        "max_packing_factor": round(m.max_packing_factor, 4),
        "seconds": round(m.solve_seconds, 4),
    }


def format_table(results: Sequence[StrategySet]) -> str:
    """A table like the paper's: algorithm, depth, packs, efficiency, packing factor, seconds."""
    header = (
        f"{'algorithm':<10} {'depth':>9} {'packs':>12} {'efficiency %':>12} "
        f"{'packing factor':>14} {'max factor':>10} {'seconds':>9}"
    )
    lines = [header, "-" * len(header)]
    for s in results:
        m = s.metrics()
        depth = str(s.max_depth) if s.max_depth else "unlimited"
        lines.append(
            f"{s.algorithm:<10} {depth:>9} {m.packs:>12,} {m.efficiency:>12.2f} "
            f"{m.packing_factor:>14.3f} {m.max_packing_factor:>10.3f} {m.solve_seconds:>9.3f}"
        )
    return "\n".join(lines)


def pack_fill(strategies: StrategySet) -> tuple[np.ndarray, np.ndarray]:
    """(tokens per pack, number of packs) for every distinct fill, sorted by fill."""
    fills: dict[int, int] = {}
    for lengths, count in strategies.strategies:
        fills[sum(lengths)] = fills.get(sum(lengths), 0) + count
    tokens = np.array(sorted(fills), dtype=np.int64)
    return tokens, np.array([fills[t] for t in tokens.tolist()], dtype=np.int64)


def plot_report(hist: np.ndarray, results: Sequence[StrategySet], path: str) -> None:
    """Saves a figure: the length histogram, how full the packs are, and the packs' depths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    max_len = len(hist) - 1
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    lengths = np.arange(max_len + 1)
    axes[0].bar(lengths[1:], hist[1:], width=1.0, color="tab:gray")
    axes[0].set(
        title=f"sequence lengths ({int(hist.sum()):,} sequences)",
        xlabel="length (tokens)",
        ylabel="sequences",
        xlim=(0, max_len + 1),
    )
    bins = np.linspace(0, 100, 51)
    for s in results:
        tokens, packs = pack_fill(s)
        m = s.metrics()
        depth = s.max_depth or "inf"
        label = f"{s.algorithm} d={depth}: {m.efficiency:.2f}%, {m.packs:,} packs"
        axes[1].hist(
            100.0 * tokens / s.max_len,
            bins=bins,
            weights=packs,
            histtype="step",
            lw=1.5,
            label=label,
        )
        depths: dict[int, int] = {}
        for contents, count in s.strategies:
            depths[len(contents)] = depths.get(len(contents), 0) + count
        keys = sorted(depths)
        axes[2].plot(keys, [depths[k] for k in keys], marker="o", label=f"{s.algorithm} d={depth}")
    axes[1].set(
        title="fill of the packs", xlabel="real tokens per pack (%)", ylabel="packs", yscale="log"
    )
    axes[1].legend(fontsize=8, loc="upper left")
    axes[2].set(title="sequences per pack", xlabel="depth", ylabel="packs", yscale="log")
    axes[2].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
