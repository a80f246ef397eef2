r"""Where a BERT pre-training step spends its time, the comparison of "Demystifying BERT".

Profiles the configured train step (bert_flax.train.setup) of the tiny BERT and of a
BERT-base-shaped model (hidden 768, 12 heads, FFN 3072, full 30,522 vocabulary; only
--base_layers layers to fit a CPU) at lengths 128 and 512, float32 against bfloat16, packed
against padded, LAMB against Shampoo, and writes a table, a stacked-bar plot and a roofline:

  python -m benchmarks.profile_report                      # a few minutes on 2 CPU cores
  python -m benchmarks.profile_report --models=tiny --out_dir=/tmp/profile_report
  python -m benchmarks.profile_report --models=tiny --limit=2 --out_dir=/tmp/p   # a quick look
  python -m benchmarks.profile_report --json   # ends with the summary as one JSON line

Each setting is one row of the sweep table (time share per class, % of the step) and one bar of
the plot. Ceilings (peak matmul FLOP/s per dtype, stream bytes/s) are measured once in this run.

`--dropout` instead compares the ways of drawing dropout's random bits (`DROPOUT_VARIANTS`:
train.prng_impl, model.attention_dropout_head_groups and model.attention_dropout_bits, no
attention dropout) at each model and length (float32, packed, LAMB): the dropout class's share
in each one's profile, and the step time of each against threefry's, timed side by side
(`timing.side_by_side`: the variants take turns, median of the rounds' ratios):

  python -m benchmarks.profile_report --dropout --models=tiny,base     # ~15 min on 2 CPU cores
  python -m benchmarks.profile_report --dropout --models=base --lengths=512 --json"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import ml_collections

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import (
    Columns,
    either,
    items_table,
    plus_minus,
    run_sources,
    runs,
    share,
    source,
)
from bert_flax.profile import configured, report
from bert_flax.profile.ceilings import Ceilings
from bert_flax.profile.profiler import StepProfile
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import paired_ratio, side_by_side
from configs import tiny


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--models", default="tiny,base", help="Model shapes to profile: tiny, base.")
    add("--base_layers", type=int, default=2, help="Layers of the BERT-base-shaped model.")
    add("--steps", type=int, default=2, help="Traced steps per setting (after warm-up).")
    add("--warmup", type=int, default=1, help="Untraced steps per setting.")
    add("--out_dir", default="docs/images", help="Where the plots and JSON lines go.")
    add("--dropout", action="store_true", help="Compare DROPOUT_VARIANTS instead.")
    add("--rounds", type=int, default=8, help="--dropout: side-by-side rounds (3 steps each).")
    add("--lengths", default="128,512", help="--dropout: sequence lengths.")
    add("--limit", type=int, default=0, help="Profile only the first N settings (0: all).")
    add("--json", action="store_true", help="End with the summary and ceilings as one JSON line.")
    return parser.parse_args()


# Rows per step: tiny at 128/512, base-shaped at 128/512 (small, to fit a CPU in minutes).
ROWS = {("tiny", 128): 8, ("tiny", 512): 2, ("base", 128): 2, ("base", 512): 1}

# (seq_len, dtype, packed, optimizer): the baseline, then one change at a time.
SETTINGS = [
    (128, "float32", True, "lamb"),
    (128, "bfloat16", True, "lamb"),
    (512, "float32", True, "lamb"),
    (512, "bfloat16", True, "lamb"),
    (128, "float32", False, "lamb"),
    (128, "float32", True, "shampoo"),
]

# --dropout: name -> config overrides (dotted keys), the first being the reference.
DROPOUT_VARIANTS = {
    "threefry": {},
    "rbg": {"train.prng_impl": "rbg"},
    "unsafe_rbg": {"train.prng_impl": "unsafe_rbg"},
    "one mask per row": {"model.attention_dropout_head_groups": "1"},
    "rbg + one mask": {"train.prng_impl": "rbg", "model.attention_dropout_head_groups": "1"},
    "8-bit masks": {"model.attention_dropout_bits": "8"},
    "rbg + 8-bit masks": {"train.prng_impl": "rbg", "model.attention_dropout_bits": "8"},
    "no attention dropout": {"model.attention_dropout_rate": "0.0"},
}


def shampoo_section(config):
    """Shampoo preconditioning from step 1, roots refreshed every 1000 steps (so the traced steps
    show its per-step work: statistics and preconditioning products, grafting, update); other
    hyper-parameters keep optim.shampoo's defaults."""
    config.optimizer = ml_collections.ConfigDict(
        {
            "name": "shampoo",
            "block_size": 128,
            "weight_decay": 0.01,
            "start_preconditioning_step": 1,
            "preconditioning_compute_steps": 1000,
        }
    )


def make_config(
    model: str, seq_len: int, dtype: str, packed: bool, optimizer: str, base_layers: int
):
    config = tiny.get_config()
    config.data.synthetic = True
    config.data.max_seq_length = seq_len
    config.data.packed = packed
    config.data.max_predictions_per_seq = 20 if seq_len <= 128 else 76
    config.train.dtype = dtype
    config.train.batch_size = ROWS[(model, seq_len)]
    config.eval.batch_size = 1
    if model == "base":
        config.model.preset = "base"
        config.model.num_layers = base_layers
    if optimizer == "shampoo":
        shampoo_section(config)
    else:
        config.optimizer.name = optimizer
    return config


def label(
    model: str, seq_len: int, dtype: str, packed: bool, optimizer: str, base_layers: int
) -> str:
    name = model if model == "tiny" else f"base{base_layers}L"
    dt = "f32" if dtype == "float32" else "bf16"
    return f"{name} {seq_len} {dt} {'packed' if packed else 'padded'} {optimizer}"


def figures(p: StepProfile) -> dict[str, Any]:
    """A setting's summary: step times, sequences/s and shares of the step (fractions): matrix
    products, other (non-matmul) work, the part of it below the roofline's ridge (memory-bound;
    None without ceilings) and the unattributed time (outside the ops' span + gaps)."""
    return {
        "label": p.label,
        "step_ms": p.step_ms,
        "pipelined_ms": p.pipelined_ms,
        "sequences_per_s": p.settings.get("sequences", 0.0) / (p.step_ms * 1e-3),
        "matmul_share": p.matmul_share(),
        "non_matmul_share": p.non_matmul_share(),
        "memory_bound_share": p.memory_bound_share(),
        "unattributed_share": p.unattributed_ms / p.step_ms,
        "outside_span_share": p.outside_span_ms / p.step_ms,
        "gaps_share": p.gaps_ms / p.step_ms,
    }


def summary(settings: list[dict[str, Any]]) -> str:
    """Matmul vs other (non-matmul) shares, the part of the latter below the roofline's ridge
    (memory-bound), and how they move with bfloat16 and sequence length (`figures`)."""
    lines = ["| setting | step ms | sequences/s | matmul % | other (non-matmul) % "
             "| of which memory-bound % | unattributed %: outside the ops' span + gaps "
             "| step ms back to back |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in settings:
        memory_bound = s["memory_bound_share"]
        mb = "-" if memory_bound is None else f"{100 * memory_bound:.1f}"
        un, out, gaps = (
            100 * s[k] for k in ("unattributed_share", "outside_span_share", "gaps_share")
        )
        lines.append(
            f"| {s['label']} | {s['step_ms']:.0f} | {s['sequences_per_s']:.1f} | "
            f"{100 * s['matmul_share']:.1f} | {100 * s['non_matmul_share']:.1f} | {mb} | "
            f"{un:.1f}: {out:.1f} + {gaps:.1f} | {s['pipelined_ms']:.0f} |"
        )
    return "\n".join(lines)


def dropout_share(profile: StepProfile) -> float:
    return sum(c.time_ms for c in profile.classes if c.name == "dropout") / profile.step_ms


def compare_dropout(args: argparse.Namespace, model: str, seq_len: int) -> list[dict]:
    """Each variant's step time (side by side and profiled), dropout share and speed-up."""
    base = make_config(model, seq_len, "float32", True, "lamb", args.base_layers)
    configs = {name: configured.with_settings(base, o) for name, o in DROPOUT_VARIANTS.items()}
    name = label(model, seq_len, "float32", True, "lamb", args.base_layers)
    shares = {}
    for variant, config in configs.items():
        profile = configured.profile_config(config, steps=args.steps, warmup=args.warmup,
                                            ceilings=False)  # fmt: skip
        shares[variant] = (profile.step_ms, dropout_share(profile))
    setups = {v: create_train_setup(c) for v, c in configs.items()}
    batches = {v: [s.make_batch(seed=i) for i in range(3)] for v, s in setups.items()}
    timings = side_by_side(setups, batches, rounds=args.rounds, steps=3)
    reference = timings["threefry"].round_step_seconds
    rows = []
    for variant, timing in timings.items():
        ratio, error = paired_ratio(reference, timing.round_step_seconds)
        ms, share = shares[variant]
        rows.append({"setting": name, "variant": variant, "step_ms": 1e3 * timing.step_seconds,
                     "profiled_step_ms": ms, "dropout_share": share, "speedup": ratio,
                     "speedup_error": error})  # fmt: skip
        print(dropout_row(rows[-1]), flush=True)
    return rows


def dropout_row(r: dict) -> str:
    return (f"| {r['setting']} | {r['variant']} | {r['step_ms']:.1f} | {r['profiled_step_ms']:.1f} "
            f"| {100 * r['dropout_share']:.1f} | {r['speedup']:.3f} ± "
            f"{r['speedup'] * r['speedup_error']:.3f} |")  # fmt: skip


def main_dropout(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    header = ["| setting | dropout bits | step ms (side by side) | step ms (profiled) | "
              "dropout % of step | speed-up vs threefry |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    rows = []
    for model in args.models.split(","):
        for seq_len in args.lengths.split(","):
            rows += compare_dropout(args, model, int(seq_len))
    print("\n".join(["", *header, *map(dropout_row, rows)]))
    print(f"\n{args.rounds} rounds of 3 steps per variant; {time.perf_counter() - start:.0f} s; "
          f"rows per step {ROWS}", flush=True)  # fmt: skip
    if args.json:
        rows_per_step = {f"{model} {length}": n for (model, length), n in ROWS.items()}
        result = {"rows": rows, "rounds": args.rounds, "rows_per_step": rows_per_step}
        publish("profile_report_dropout", result)


def main() -> None:
    args = parse_args()
    if args.dropout:
        return main_dropout(args)
    os.makedirs(args.out_dir, exist_ok=True)
    plan = [(m, *s) for m in args.models.split(",") for s in SETTINGS][: args.limit or None]
    measured: dict[str, Ceilings] = {}
    profiles: list[StepProfile] = []
    failed: list[str] = []
    start = time.perf_counter()
    for i, (model, seq_len, dtype, packed, optimizer) in enumerate(plan):
        name = label(model, seq_len, dtype, packed, optimizer, args.base_layers)
        elapsed = time.perf_counter() - start
        eta = elapsed / i * (len(plan) - i) if i else float("nan")
        print(f"[{i + 1}/{len(plan)}] {name}  (elapsed {elapsed:.0f} s, ETA {eta:.0f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
        config = make_config(model, seq_len, dtype, packed, optimizer, args.base_layers)
        try:
            result = configured.profile_config(
                config,
                steps=args.steps,
                warmup=args.warmup,
                label=name,
                ceilings=measured.get(dtype, True),
            )
        except Exception as e:  # report it and go on with the other settings
            failed.append(f"{name}: {type(e).__name__}: {e}")
            print(f"FAILED {failed[-1]}", file=sys.stderr, flush=True)
            continue
        if result.ceilings is not None:
            measured[dtype] = result.ceilings
        profiles.append(result)
        print(report.format_table(result), end="\n\n", flush=True)

    print("## Time share per class (% of the step)\n")
    print(report.format_sweep(profiles, markdown=True), end="\n\n")
    print("## Matrix products against other (non-matmul) work\n")
    settings = [figures(p) for p in profiles]
    print(summary(settings), end="\n\n")
    for dtype, c in measured.items():
        print(f"ceiling {dtype}: {c.flops_per_s / 1e9:.1f} GFLOP/s ({c.matmul_size}^3 matmul), "
              f"{c.bytes_per_s / 1e9:.1f} GB/s stream")  # fmt: skip

    for line in failed:
        print(f"FAILED {line}")
    if not profiles:
        raise SystemExit("every setting failed")
    out = args.out_dir
    with open(os.path.join(out, "profile_report.jsonl"), "w") as f:
        for p in profiles:
            f.write("\n".join(report.json_lines(p)) + "\n")
    report.plot_stacked(profiles, os.path.join(out, "profile_breakdown.png"),
                        title="BERT training step on CPU: share of time per class")  # fmt: skip
    picks = [p for p in profiles if p.label.endswith("128 f32 packed lamb")] or profiles[:1]
    picks += [p for p in profiles if p.label.endswith("128 bf16 packed lamb")][:1]
    report.plot_roofline(picks, os.path.join(out, "profile_roofline.png"))
    print(f"\nwrote {out}/profile_breakdown.png, profile_roofline.png, profile_report.jsonl "
          f"in {time.perf_counter() - start:.0f} s", file=sys.stderr)  # fmt: skip
    if args.json:
        ceilings = {dtype: dataclasses.asdict(c) for dtype, c in measured.items()}
        publish("profile_report", {"settings": settings, "ceilings": ceilings})


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def profile_row(read: Read) -> tuple[str, str]:
    lamb = [s for s in read("profile_report")["result"]["settings"] if s["label"].endswith("lamb")]
    span = lambda key: "-".join(f"{100 * f(s[key] for s in lamb):.0f}" for f in (min, max))
    return "where a step's time goes (profiler, LAMB settings)", (
        f"non-matmul work {span('non_matmul_share')}% of the step, nearly all memory-bound by "
        f"the roofline; matrix products {span('matmul_share')}%"
    )


PROFILE_COLUMNS: Columns = {
    "setting": lambda s: s["label"],
    "step (ms)": lambda s: s["step_ms"],
    "sequences / s": lambda s: s["sequences_per_s"],
    "matrix products": lambda s: share(s["matmul_share"]),
    "other work": lambda s: share(s["non_matmul_share"]),
    "memory-bound (roofline)": lambda s: share(s["memory_bound_share"]),
    "unattributed": lambda s: share(s["unattributed_share"]),
}


def profile_block(read: Read) -> str:
    settings = read("profile_report")["result"]["settings"]
    return f"{source('profile_report', read)}\n\n{items_table(settings, PROFILE_COLUMNS)}"


DROPOUT_COLUMNS: Columns = {
    "setting": lambda r: r["setting"],
    "dropout bits": lambda r: r["variant"],
    "step ms (side by side)": lambda r: either(r.get("step_ms"), ".1f"),
    "step ms (profiled)": lambda r: either(r.get("profiled_step_ms"), ".1f"),
    "dropout share of step": lambda r: share(r["dropout_share"]) if "dropout_share" in r else "-",
    "speed-up vs threefry": lambda r: plus_minus(r["speedup"], r["speedup_error"], 3),
}


def dropout_block(read: Read) -> str:
    name = "profile_report_dropout"
    parts = list(zip(run_sources(name, read), runs(name, read)))
    parts = [parts[-1], *parts[:-1]]  # its own run, then the earlier one (base at 512)
    return "\n\n".join(
        f"{line}\n\n{items_table(run['result']['rows'], DROPOUT_COLUMNS)}" for line, run in parts
    )


BLOCKS: dict[str, Callable[[Read], str]] = {
    "profile_report": profile_block,
    "profile_report_dropout": dropout_block,
}
README_ROW = (
    profile_row,
    "`python -m benchmarks.profile_report` "
    "([results](docs/results.md#what-it-shows-for-bert-pre-training))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
