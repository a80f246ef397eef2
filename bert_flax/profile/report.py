"""Tables, JSON lines and plots of `StepProfile`s."""

from __future__ import annotations

import json

from bert_flax.hlo import classify
from bert_flax.profile.profiler import ClassStats, StepProfile

_HEADER = ("class", "time %", "ms", "GFLOP", "GB", "FLOP/B", "GFLOP/s", "% ceil")


def _row(s: ClassStats, p: StepProfile) -> tuple[str, ...]:
    frac = s.ceiling_fraction(p.ceilings)
    return (
        s.label,
        f"{100 * s.time_ms / p.step_ms:.1f}" if p.step_ms else "-",
        f"{s.time_ms:.3f}",
        f"{s.flops / 1e9:.3f}",
        f"{s.bytes / 1e9:.4f}",
        f"{s.intensity:.1f}",
        f"{s.flops_per_s / 1e9:.1f}",
        f"{100 * frac:.0f}" if frac is not None else "-",
    )


def _format(rows: list[tuple[str, ...]], header: tuple[str, ...], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
    )
    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([fmt(header), rule, *(fmt(r) for r in rows[:-1]), rule, fmt(rows[-1])])


def format_table(p: StepProfile, *, markdown: bool = False) -> str:
    """One row per class (by time), the unattributed remainder, and the step total."""
    rows = [_row(s, p) for s in sorted(p.classes, key=lambda s: -s.time_ms)]
    un = p.unattributed_ms
    rows.append((classify.LABELS["unattributed"], f"{100 * un / p.step_ms:.1f}", f"{un:.3f}")
                + ("",) * 5)  # fmt: skip
    total = ClassStats("step", p.step_ms, p.total_flops, p.total_bytes, len(p.ops))
    rows.append(("step total", *_row(total, p)[1:]))
    out = _format(rows, _HEADER, markdown)
    if not markdown:
        out = f"{describe(p)}\n{out}"
    return out


def describe(p: StepProfile) -> str:
    c = p.ceilings
    head = (
        f"{p.label or p.module}: {p.step_ms:.2f} ms/step over {p.runs} traced runs on {p.timeline}"
    )
    if c:
        head += (
            f"; ceilings {c.flops_per_s / 1e9:.1f} GFLOP/s ({c.matmul_dtype} {c.matmul_size}^3 "
            f"matmul), {c.bytes_per_s / 1e9:.1f} GB/s (stream), "
            f"ridge {c.ridge_intensity:.1f} FLOP/B"
        )
    head += (
        f"; unattributed {p.unattributed_ms:.2f} ms = {p.outside_span_ms:.2f} before the first "
        f"op and after the last (dispatch, transfers) + {p.gaps_ms:.2f} between ops; "
        f"{p.pipelined_ms:.2f} ms/step dispatched back to back as in training"
    )
    xla = p.xla_cost.get("flops")
    if xla:
        head += f"; XLA cost analysis {xla / 1e9:.3f} GFLOP vs {p.total_flops / 1e9:.3f} counted"
    return head


def json_lines(p: StepProfile) -> list[str]:
    """One JSON object per class, then one for the unattributed time and one for the step."""
    base = {"label": p.label, **p.settings}
    lines = []
    for s in sorted(p.classes, key=lambda s: -s.time_ms):
        frac = s.ceiling_fraction(p.ceilings)
        lines.append(
            {
                **base,
                "class": s.name,
                "time_ms": s.time_ms,
                "time_frac": s.time_ms / p.step_ms if p.step_ms else 0.0,
                "gflop": s.flops / 1e9,
                "gbytes": s.bytes / 1e9,
                "intensity": s.intensity,
                "gflops_per_s": s.flops_per_s / 1e9,
                "ceiling_frac": frac,
                "ops": s.ops,
            }
        )
    lines.append(
        {
            **base,
            "class": "unattributed",
            "time_ms": p.unattributed_ms,
            "time_frac": p.unattributed_ms / p.step_ms if p.step_ms else 0.0,
            "outside_span_ms": p.outside_span_ms,
            "gaps_ms": p.gaps_ms,
        }
    )
    c = p.ceilings
    lines.append(
        {
            **base,
            "class": "total",
            "time_ms": p.step_ms,
            "span_ms": p.span_ms,
            "pipelined_ms": p.pipelined_ms,
            "attributed_ms": p.attributed_ms,
            "gflop": p.total_flops / 1e9,
            "gbytes": p.total_bytes / 1e9,
            "xla_gflop": p.xla_cost.get("flops", 0.0) / 1e9,
            "matmul_time_frac": p.matmul_share(),
            "non_matmul_time_frac": p.non_matmul_share(),
            "memory_bound_time_frac": p.memory_bound_share(),
            "peak_gflops_per_s": c.flops_per_s / 1e9 if c else None,
            "peak_gbytes_per_s": c.bytes_per_s / 1e9 if c else None,
            "runs": p.runs,
            "timeline": p.timeline,
        }
    )
    return [json.dumps(line, sort_keys=False) for line in lines]


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}"


def format_sweep(profiles: list[StepProfile], *, markdown: bool = False) -> str:
    """Time share (%) of each class, one column per setting, plus step ms, the matmul and other
    (non-matmul) shares, and the part of the latter the roofline calls memory-bound."""
    names = [n for n in classify.CLASSES if any(n in p.by_class() for p in profiles)]
    header = ("class", *(p.label for p in profiles))
    rows = []
    for n in names:
        cells = []
        for p in profiles:
            s = p.by_class().get(n)
            cells.append(f"{100 * s.time_ms / p.step_ms:.1f}" if s and p.step_ms else "-")
        rows.append((classify.LABELS[n], *cells))
    rows.append(
        (
            classify.LABELS["unattributed"],
            *(f"{100 * p.unattributed_ms / p.step_ms:.1f}" for p in profiles),
        )
    )
    rows.append(("all matmuls %", *(f"{100 * p.matmul_share():.1f}" for p in profiles)))
    rows.append(("other (non-matmul) %", *(f"{100 * p.non_matmul_share():.1f}" for p in profiles)))
    rows.append(
        ("  memory-bound by roofline %", *(_percent(p.memory_bound_share()) for p in profiles))
    )
    rows.append(("step ms", *(f"{p.step_ms:.1f}" for p in profiles)))
    return _format(rows, header, markdown)


# ----------------------------------------------------------------------------------------------
# Plots


def _colors(names: list[str]) -> dict[str, tuple]:
    import matplotlib

    blues = matplotlib.colormaps["Blues"]
    warm = matplotlib.colormaps["tab20"]
    out = {}
    mm = [n for n in names if n in classify.MATMUL_CLASSES]
    for i, n in enumerate(mm):
        out[n] = blues(0.35 + 0.6 * i / max(len(mm) - 1, 1))
    rest = [n for n in names if n not in out]
    for i, n in enumerate(rest):
        out[n] = warm((2 + i) % 20)
    out["unattributed"] = (0.8, 0.8, 0.8, 1.0)
    return out


def plot_stacked(profiles: list[StepProfile], path: str, *, title: str = "") -> None:
    """One bar per profile, stacked by class, as a share of its step time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in classify.CLASSES if any(n in p.by_class() for p in profiles)]
    names.append("unattributed")
    colors = _colors(names)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(profiles) + 4.5), 5.0))
    x = range(len(profiles))
    bottom = [0.0] * len(profiles)
    for n in names:
        values = []
        for p in profiles:
            t = p.unattributed_ms if n == "unattributed" else p.by_class().get(n)
            t = t if isinstance(t, float) else (t.time_ms if t else 0.0)
            values.append(100 * t / p.step_ms if p.step_ms else 0.0)
        ax.bar(x, values, bottom=bottom, color=colors[n], label=classify.LABELS[n], width=0.7)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(list(x))
    ax.set_xticklabels([p.label or p.module for p in profiles], rotation=30, ha="right")
    ax.set_ylabel("share of step time (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title or "Where the step's time goes")
    handles, labels = ax.get_legend_handles_labels()  # top of the stack first, as in the bars
    ax.legend(handles[::-1], labels[::-1], loc="center left", bbox_to_anchor=(1.01, 0.5),
              fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_roofline(profiles: list[StepProfile], path: str, *, title: str = "") -> None:
    """Each class at (FLOP/byte, achieved FLOP/s) under the measured ceilings; area ~ time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = "osD^vP*Xh<>"
    names = [n for n in classify.CLASSES if any(n in p.by_class() for p in profiles)]
    colors = _colors(names)
    fig, ax = plt.subplots(figsize=(9.5, 5.5))
    lo, hi = 1e-2, 1e3
    for k, p in enumerate(profiles):
        c = p.ceilings
        if c is not None:
            xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            ys = [min(c.flops_per_s, x * c.bytes_per_s) / 1e9 for x in xs]
            label = f"ceiling {p.label}" if len(profiles) > 1 else "measured ceiling"
            ax.plot(xs, ys, color="0.3", lw=1.2, ls=["-", "--", ":", "-."][k % 4], label=label)
        for s in p.classes:
            if s.flops <= 0 or s.bytes <= 0 or s.time_ms <= 0:
                continue
            size = 20 + 600 * s.time_ms / p.step_ms
            ax.scatter(s.intensity, s.flops_per_s / 1e9, s=size, color=colors[s.name],
                       marker=markers[k % len(markers)], edgecolors="k", linewidths=0.5,
                       alpha=0.85, label=classify.LABELS[s.name] if k == 0 else None)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(title or "Roofline: operation classes of one training step (area ~ time)")
    ax.grid(True, which="both", alpha=0.25)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8,
              frameon=False, markerscale=0.6)  # fmt: skip
    if profiles and len(profiles) > 1:
        legend = ", ".join(f"{markers[k % len(markers)]} {p.label}" for k, p in enumerate(profiles))
        ax.text(0.01, 0.01, f"markers: {legend}", transform=ax.transAxes, fontsize=7)
    ymin = min(
        (
            s.flops_per_s / 1e9
            for p in profiles
            for s in p.classes
            if s.flops > 0 and s.bytes > 0 and s.time_ms > 0
        ),
        default=1.0,
    )
    ax.set_ylim(max(ymin / 3, 1e-3), None)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
