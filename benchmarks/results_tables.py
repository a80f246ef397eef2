r"""Figures in the docs rendered from the published results files, so that no doc can drift from
the run that measured it.

    python benchmarks/results.py --docs     # rewrites every marked block in README.md and docs/
    python benchmarks/results.py --check    # names the blocks that differ from their files

A doc marks a block with `<!-- results:NAME -->` and `<!-- /results -->`; NAME is a key of
`BLOCKS`, whose function renders it (markdown) from the files in `benchmarks/results/`. To change
a figure, rerun its benchmark (it rewrites its file) and run `--docs`; prose around a block
describes what the block shows, it does not restate its figures.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable

from results import PUBLISHED, Read, read

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(<!-- results:(\w+)[^\n]*-->\n)(.*?)(<!-- /results -->)", re.S)


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def times(value: float) -> str:
    return f"{value:.2f}x"


def points(gain: float) -> str:
    return f"{100 * gain:+.1f}"


def share(value: float) -> str:
    return f"{100 * value:.1f}%"


def machine_text(machine: dict) -> str:
    """The machine a result was measured on, as a results file records it."""
    return ", ".join(
        str(machine[key]) + (" cores" if key == "cores" else "")
        for key in ("cpu", "cores", "load")
        if machine.get(key)
    )


def source(name: str, read: Read) -> str:
    """Where a block's figures come from: the file, its command, date, machine and commit."""
    record = read(name)
    where = machine_text(record["machine"])
    date = record["date"] or "date not recorded"
    commit = record["commit"] if record["commit"] == "unknown" else record["commit"][:10]
    commit += "+dirty" if record["commit"].endswith("+dirty") else ""
    line = f"`benchmarks/results/{name}.json`: `{record['command']}` ({date}; {where}; "
    line += f"commit {commit})"
    if record.get("provenance"):
        line += f". {record['provenance']}"
    return line


# The README's rows: each renders (result, figure) from the results files it names.


def _run(runs: list[dict], algorithm: str, depth: int) -> dict:
    return next(r for r in runs if r["algorithm"] == algorithm and r["depth"] == depth)


def packing_row(read: Read) -> tuple[str, str]:
    squad = read("packing_bench")["result"]["squad"]
    padded, lp = _run(squad["runs"], "none", 1), _run(squad["runs"], "lp", 3)
    bound = lp["lower_bound"]
    bound = " = its proven lower bound" if lp["packs"] == bound else f", bound {bound:,}"
    return f"packing efficiency, SQuAD 1.1 at {squad['max_len']}, depth {lp['depth']}", (
        f"padded {padded['efficiency']:.2f}%; LP {lp['efficiency']:.2f}% ({lp['packs']:,} packs"
        f"{bound}, packing factor {lp['packing_factor']:.3f})"
    )


PACKED_VS_PADDED_CASES = {"wikipedia-like 512": "Wikipedia-like", "SQuAD 1.1 384": "SQuAD"}


def packed_vs_padded_row(read: Read) -> tuple[str, str]:
    cases = read("packed_vs_padded")["result"]["cases"]
    figures = [
        f"{c['speedup']:.2f}x at {c['max_seq_length']} ({PACKED_VS_PADDED_CASES[c['case']]}, "
        f"{'packing factor ' if i == 0 else ''}{c['packing_factor']:.3f})"
        for i, c in enumerate(cases)
    ]
    return "packed vs padded, same model and rows, step timed side by side", ", ".join(figures)


TIME_TO_ACCURACY_ROWS = {
    "packed+soap": "packed + SOAP",
    "packed+muon": "packed + Muon",
    "packed+shampoo": "packed + Shampoo (async)",
    "packed+lamb": "packed + LAMB",
    "packed+adamw": "packed + AdamW",
}


def time_to_accuracy_row(read: Read) -> tuple[str, str]:
    r = read("time_to_accuracy")["result"]
    speedup, steps = r["speedup_vs_padded_lamb"], r["steps_to_target"]
    seconds = r["seconds_to_target"]["padded+lamb"]  # shown in whole seconds elapsed
    rows = sorted(TIME_TO_ACCURACY_ROWS, key=lambda row: -speedup[row])
    figures = []
    for i, row in enumerate(rows):
        detail = f"{steps[row]:,}" + (" steps" if i == 0 else "")
        if row == "packed+lamb":
            detail += f"; {speedup[row] / r['packing_factor']:.2f} x the packing factor"
        text = f"{TIME_TO_ACCURACY_ROWS[row]} {speedup[row]:.2f}x"
        figures.append((f"**{text}**" if i == 0 else text) + f" ({detail})")
    result = (
        f"time to eval masked-LM accuracy {r['target']:g} (CPU recipe, baseline "
        f"{r['baseline']:.3f}; each row at its {r['grid']}-point grid's best rate, median of "
        f"{r['seeds']} seeds) vs padded + LAMB ({int(seconds)} s, "
        f"{steps['padded+lamb']:,} steps)"
    )
    return result, ", ".join(figures)


CPU_RUNS = {"cpu_pretrain_soap": "SOAP", "cpu_pretrain": "AdamW"}


def cpu_pretrain_row(read: Read) -> tuple[str, str]:
    finals = {name: read(name)["result"] for name in CPU_RUNS}
    reached = ", ".join(
        f"{final['eval']['masked_lm_accuracy']:.3f} with {CPU_RUNS[name]}"
        for name, final in finals.items()
    )
    baseline = finals["cpu_pretrain_soap"]["baseline"]
    return "CPU pre-training past the plateau (2 cores, 15 min, packed)", (
        f"eval masked-LM accuracy {reached} (most-frequent-token baseline {baseline:.3f})"
    )


def learning_curves_row(read: Read) -> tuple[str, str]:
    r = read("learning_curves")["result"]
    return (
        f"learning curves, packed vs padded per sequence ({r['seeds']} seeds, {r['steps']} steps)",
        f"largest gap past the plateau {100 * r['max_curve_gap']:.2f} points (to "
        f"{r['mlm_accuracy_packed']:.3f}; baseline {r['baseline']:.3f})",
    )


def finetune_row(read: Read) -> tuple[str, str]:
    r = read("finetune_packed_vs_padded")["result"]
    sets = r["sets"].values()
    each = lambda key, fmt: " / ".join(format(s[key], fmt) for s in sets)
    times = " / ".join(f"{s['speedup']:.2f}x" for s in sets)
    over = " / ".join(f"{s['speedup'] / s['packing_factor']:.2f}" for s in sets)
    return (
        f"fine-tuning packed vs padded at packing factors {each('packing_factor', '.2f')} "
        f"(median of {r['seeds']} seeds)",
        f"validation accuracy packed {each('accuracy_packed', '.4f')} vs padded "
        f"{each('accuracy_padded', '.4f')}; step speed-up {times} "
        f"({over} of the packing factor)",
    )


def label_efficiency_row(read: Read) -> tuple[str, str]:
    r = read("label_efficiency")["result"]
    gains = ", ".join(f"{points(s['gain'])} at {s['train_examples']:,}" for s in r["sizes"])
    return (
        f"fine-tuning with few labels: the demo's pre-trained model vs a random start (median "
        f"of {r['seeds']} seeds, validation accuracy; majority class {r['baseline']:.3f})",
        f"gain in points by labelled examples: {gains}",
    )


def squad_row(read: Read) -> tuple[str, str]:
    r = read("squad_packed_vs_padded")["result"]
    f1 = lambda start: "{} packed vs {} padded".format(
        *(f"{r['cloze'][f'{start}/{layout}']['f1']:.1f}" for layout in ("packed", "padded"))
    )
    speeds = ", ".join(
        f"{s['speedup']:.2f}x at {name} (packing factor {s['packing_factor']:.2f})"
        for name, s in r["speed"].items()
    )
    return (
        f"SQuAD-style QA fine-tuning packed vs padded, cloze set (median of {r['seeds']} seeds)",
        f"F1 from the demo's model {f1('pre-trained')}, from random weights {f1('random')}; "
        f"step speed-up {speeds}",
    )


def profile_row(read: Read) -> tuple[str, str]:
    lamb = [s for s in read("profile_report")["result"]["settings"] if s["label"].endswith("lamb")]
    span = lambda key: "-".join(f"{100 * f(s[key] for s in lamb):.0f}" for f in (min, max))
    return "where a step's time goes (profiler, LAMB settings)", (
        f"non-matmul work {span('non_matmul_share')}% of the step, nearly all memory-bound by "
        f"the roofline; matrix products {span('matmul_share')}%"
    )


HEADLINE_CELL = ("base", 512, "v5e-8", True)


def compile_row(read: Read) -> tuple[str, str]:
    cells = read("compile_table")["cells"]
    listed = lambda key: list(dict.fromkeys(c[key] for c in cells))
    models = " and ".join(f"BERT-{m}" for m in listed("model"))
    layouts = " and ".join("packed" if p else "padded" for p in listed("packed"))
    by_key = {(c["model"], c["length"], c["target"], c["packed"]): c for c in cells}
    packed, padded = by_key.get(HEADLINE_CELL), by_key.get((*HEADLINE_CELL[:3], False))
    headline = ""
    if packed and padded:
        gain = packed["sequences_per_s"] / padded["sequences_per_s"] / packed["packing_factor"]
        headline = (
            f"; BERT-base packed at 512 on v5e-8: **MFU {packed['mfu']:.0%}**, "
            f"{packed['sequences_per_s']:,.0f} sequences/s, {gain:.2f} of the packing factor "
            "over padded"
        )
    return (
        "will it fit, how fast could it be (compiled for TPU and GPU on this CPU host; "
        "**predictions**: roofline, not measured)",
        f"{models}, {layouts}, on {', '.join(listed('target'))}: fits, largest batch, HBM, "
        f"FLOPs, collectives, step time, sequences/s (predictions from compiles){headline}",
    )


def attention_dropout_row(read: Read) -> tuple[str, str]:
    r = read("attention_dropout")["result"]
    return (
        f"attention dropout 0.1 vs none, CPU recipe, {r['steps']:,} steps (median of "
        f"{r['seeds']} seeds)",
        f"eval masked-LM accuracy {r['median']['0.1']:.4f} with vs {r['median']['0']:.4f} "
        f"without (baseline {r['baseline']:.4f}): the TPU presets drop it at 512 (splash)",
    )


def block_sparse_row(read: Read) -> tuple[str, str]:
    def case(name: str, impl: str, density: float) -> dict:
        cases = read(name)["result"]["cases"]
        key = (impl, 32, density)
        return next(c for c in cases if (c["impl"], c["block_size"], c["density"]) == key)

    ten, five = case("block_sparse_bench", "cpu", 0.1), case("block_sparse_bench", "cpu", 0.05)
    xla, second = case("block_sparse_bench", "xla", 0.1), case(SECOND_RUN, "cpu", 0.1)
    side = ten["features"]
    return f"block-sparse {side}x{side} vs dense `jnp.dot`, block 32, C++ CPU kernel", (
        f"10% density: **{ten['fwd_bwd_speedup']:.2f}x forward+backward** "
        f"({ten['fwd_speedup']:.2f}x forward; {second['fwd_bwd_speedup']:.2f}x / "
        f"{second['fwd_speedup']:.2f}x in a second run), 5%: {five['fwd_bwd_speedup']:.1f}x; "
        f"the XLA path {xla['fwd_bwd_speedup']:.2f}x"
    )


def block_sparse_learning_row(read: Read) -> tuple[str, str]:
    r = read("block_sparse_learning")["result"]
    best, dense = r["best_sparse"], r["settings"]["dense"]
    figures = r["settings"][best]
    return (
        f"wider block-sparse FFN ({best}, same FLOPs a token) vs dense, CPU recipe, "
        f"{r['minutes']:g} minutes",
        f"**{points(r['gain_equal_seconds'])} points at equal seconds**, "
        f"{points(r['gain_equal_steps'])} at equal steps ({figures['accuracy_equal_seconds']:.3f} "
        f"vs {dense['accuracy_equal_seconds']:.3f}, baseline {r['baseline']:.3f}); its FFN costs "
        f"{times(figures['ffn_seconds'] / dense['ffn_seconds'])} the dense one's time",
    )


SECOND_RUN = "block_sparse_bench_second_run"  # transcribed: block 32 at 10 % in another run
README_ROWS: list[tuple[Callable[[Read], tuple[str, str]], str]] = [
    (
        packing_row,
        "`python benchmarks/packing_bench.py` ([results](docs/results.md#packing))",
    ),
    (
        packed_vs_padded_row,
        "`python benchmarks/packed_vs_padded.py --json` "
        "([results](docs/results.md#packed-versus-padded))",
    ),
    (
        time_to_accuracy_row,
        "`python benchmarks/time_to_accuracy.py --seeds=3 --grid=3 --target=0.25 --json` "
        "([results](docs/results.md#time-to-accuracy))",
    ),
    (
        cpu_pretrain_row,
        "`python -m bert_flax.train --config=configs/cpu_pretrain_soap.py "
        "--workdir=workdir/cpu_soap --config.data.data_dir=workdir/sotu_cpu` "
        "([results](docs/results.md#the-cpu-pre-training-recipe))",
    ),
    (
        learning_curves_row,
        "`python benchmarks/learning_curves.py --json --recipe=cpu_pretrain --steps=800 "
        "--eval_every=200 --finetune_epochs=1` "
        "([results](docs/results.md#packed-and-padded-learn-alike-per-sequence))",
    ),
    (
        finetune_row,
        "`python benchmarks/finetune_packed_vs_padded.py --json` "
        "([results](docs/results.md#fine-tuning))",
    ),
    (
        label_efficiency_row,
        "`python benchmarks/label_efficiency.py --json` "
        "([results](docs/results.md#fine-tuning-with-few-labels))",
    ),
    (
        squad_row,
        "`python benchmarks/squad_packed_vs_padded.py --train_examples=3000 --json` "
        "([results](docs/results.md#question-answering))",
    ),
    (
        profile_row,
        "`python benchmarks/profile_report.py` "
        "([results](docs/results.md#what-it-shows-for-bert-pre-training))",
    ),
    (
        compile_row,
        "`python benchmarks/compile_table.py` "
        "([compile](docs/compile.md#the-table-before-booking-tpus))",
    ),
    (
        attention_dropout_row,
        "`python benchmarks/attention_dropout.py --json` "
        "([results](docs/results.md#attention-dropout-at-512))",
    ),
    (
        block_sparse_row,
        "`python benchmarks/block_sparse_bench.py --impls=cpu,xla` "
        "([results](docs/results.md#block-sparse))",
    ),
    (
        block_sparse_learning_row,
        "`python benchmarks/block_sparse_learning.py --json` "
        "([results](docs/results.md#does-a-wider-sparse-ffn-learn-more))",
    ),
]


def readme_table(read: Read) -> str:
    """The README's table of headline results."""
    return table(
        ["result", "figure", "command (details)"],
        [[*render(read), command] for render, command in README_ROWS],
    )


# The results page's blocks: each shows one file whole (some with another run's file).

Columns = dict[str, Callable[[dict], object]]  # header -> the cell of an item


def items_table(items: list[dict], columns: Columns) -> str:
    """A markdown table of `items`, one row each, cells from `columns`."""
    return table(list(columns), [[cell(item) for cell in columns.values()] for item in items])


PACKING_COLUMNS: Columns = {
    "algorithm": lambda r: r["algorithm"],
    "depth": lambda r: r["depth"] or "unlimited",
    "packs": lambda r: f"{r['packs']:,}",
    "efficiency": lambda r: f"{r['efficiency']}%",
    "packing factor": lambda r: r["packing_factor"],
    "lower bound": lambda r: f"{r['lower_bound']:,}" if "lower_bound" in r else "-",
    "solve (s)": lambda r: r.get("solve_seconds", "-"),
}


def packing_block(read: Read) -> str:
    parts = [source("packing_bench", read)]
    for name, case in read("packing_bench")["result"].items():
        bound = case["runs"][0]["max_packing_factor"]
        parts.append(
            f"{name}, rows of {case['max_len']} tokens (the packing factor at most {bound}):"
            f"\n\n{items_table(case['runs'], PACKING_COLUMNS)}"
        )
    return "\n\n".join(parts)


PACKED_VS_PADDED_COLUMNS: Columns = {
    "case": lambda c: c["case"],
    "rows a step": lambda c: c["rows"],
    "packing factor": lambda c: c["packing_factor"],
    "packed seq/s": lambda c: c["packed_sequences_per_s"],
    "padded seq/s": lambda c: c["padded_sequences_per_s"],
    "speed-up": lambda c: times(c["speedup"]),
    "speed-up / packing factor": lambda c: c["speedup_over_packing_factor"],
    "timing": lambda c: c["timing"],
}


def packed_vs_padded_block(read: Read) -> str:
    cases = read("packed_vs_padded")["result"]["cases"]
    return f"{source('packed_vs_padded', read)}\n\n{items_table(cases, PACKED_VS_PADDED_COLUMNS)}"


def time_to_accuracy_block(read: Read) -> str:
    r = read("time_to_accuracy")["result"]
    missed = lambda value, spec: "missed" if value is None else format(value, spec)
    ratio = lambda row: r.get("step_time_over_packed_lamb", {}).get(row)
    compiled = r.get("compile_seconds")
    columns: Columns = {
        "row": lambda row: row,
        "learning rate": lambda row: r["learning_rates"][row],
        "seconds to target": lambda row: missed(r["seconds_to_target"][row], ".1f"),
        "compile (s)": lambda row: missed(compiled[row], ".1f") if compiled else "not recorded",
        "steps": lambda row: missed(r["steps_to_target"][row], ","),
        "sequences": lambda row: missed(r["sequences_to_target"][row], ","),
        "speed-up vs padded + LAMB": lambda row: times(r["speedup_vs_padded_lamb"][row]),
        "step time / packed + LAMB": lambda row: (
            "{:.2f} ± {:.2f}".format(*ratio(row)) if ratio(row) else "-"
        ),
    }
    return (
        f"{source('time_to_accuracy', read)}\n\nTarget eval masked-LM accuracy {r['target']} "
        f"(most-frequent-token baseline {r['baseline']}), packing factor {r['packing_factor']}, "
        f"medians of {r['seeds']} seeds at each row's best rate of a {r['grid']}-point grid:"
        f"\n\n{items_table(list(r['seconds_to_target']), columns)}"
    )


def time_to_accuracy_rerun_block(read: Read) -> str:
    """The headline's rows rerun at the rates the grid chose, beside the published run."""
    before, after = (
        read(name)["result"] for name in ("time_to_accuracy", "time_to_accuracy_rerun")
    )
    missed = lambda value, spec: "missed" if value is None else format(value, spec)
    speedup = lambda r, row: (
        "-" if r["speedup_vs_padded_lamb"][row] is None else times(r["speedup_vs_padded_lamb"][row])
    )
    columns: Columns = {
        "row": lambda row: row,
        "learning rate": lambda row: f"{after['learning_rates'][row]:g}",
        "steps, before / after": lambda row: (
            f"{missed(before['steps_to_target'][row], ',.0f')} / "
            f"{missed(after['steps_to_target'][row], ',.0f')}"
        ),
        "seconds, after": lambda row: missed(after["seconds_to_target"][row], ".1f"),
        "compile (s), after": lambda row: f"{after['compile_seconds'][row]:.1f}",
        "speed-up vs padded + LAMB, before / after": lambda row: (
            f"{speedup(before, row)} / {speedup(after, row)}"
        ),
    }
    return (
        f"{source('time_to_accuracy_rerun', read)}\n\nBefore: the published run above (its "
        f"training seconds then included compiling the first step); after: the same rows at the "
        f"same rates with the fixes (training seconds from the compiled step on, compile seconds "
        f"beside them), target {after['target']}, medians of {after['seeds']} seeds. Seconds are "
        f"not compared across the two runs (machines differ in speed from session to session); "
        f"the speed-ups are ratios within each run:\n\n"
        f"{items_table(list(after['seconds_to_target']), columns)}"
    )


def cpu_pretrain_block(name: str) -> Callable[[Read], str]:
    """The block of one run of the CPU recipe (`CPU_RUNS`): where it ended."""
    columns: Columns = {
        "optimizer": lambda final: CPU_RUNS[name],
        "steps": lambda final: f"{final['step']:,}",
        "sequences": lambda final: f"{final['sequences_seen']:,}",
        "training seconds": lambda final: final["train_seconds"],
        "eval masked-LM accuracy": lambda final: final["eval"]["masked_lm_accuracy"],
        "most-frequent-token baseline": lambda final: final["baseline"],
    }
    return lambda read: f"{source(name, read)}\n\n{items_table([read(name)['result']], columns)}"


def learning_curves_block(read: Read) -> str:
    r = read("learning_curves")["result"]
    curves, metric = r["curves"], "masked_lm_accuracy"
    span = lambda layout, i: "{} ({}-{})".format(
        *(curves[layout][f"{metric}{end}"][i] for end in ("", "_min", "_max"))
    )
    gap = lambda i: curves["packed"][metric][i] - curves["padded"][metric][i]
    columns: Columns = {
        "step": lambda i: curves["packed"]["step"][i],
        "packed (min-max)": lambda i: span("packed", i),
        "padded (min-max)": lambda i: span("padded", i),
        "gap (points)": lambda i: f"{100 * gap(i):+.2f}",
    }
    evaluations = list(range(len(curves["packed"]["step"])))
    return (
        f"{source('learning_curves', read)}\n\nEval masked-LM accuracy, median of {r['seeds']} "
        f"seeds (most-frequent-token baseline {r['baseline']}, packing factor "
        f"{r['packing_factor']}):\n\n{items_table(evaluations, columns)}\n\nFine-tuned from the "
        f"packed run: {r['finetune_pretrained']} validation accuracy; from a random start "
        f"{r['finetune_random']}."
    )


FINETUNE_COLUMNS: Columns = {
    "set": lambda s: s["name"],
    "packing factor": lambda s: s["packing_factor"],
    "rows a step (padded / packed)": lambda s: "{padded} / {packed}".format(**s["rows_per_step"]),
    "steps": lambda s: "{padded} / {packed}".format(**s["steps"]) if "steps" in s else "-",
    "padded accuracy": lambda s: s["accuracy_padded"],
    "packed accuracy": lambda s: s["accuracy_packed"],
    "step speed-up": lambda s: times(s["speedup"]),
    "of the packing factor": lambda s: f"{s['speedup'] / s['packing_factor']:.2f}",
}


def finetune_block(read: Read) -> str:
    r = read("finetune_packed_vs_padded")["result"]
    sets = [{"name": name, **s} for name, s in r["sets"].items()]
    return (
        f"{source('finetune_packed_vs_padded', read)}\n\nValidation accuracy, median of "
        f"{r['seeds']} seeds:\n\n{items_table(sets, FINETUNE_COLUMNS)}"
    )


SQUAD_COLUMNS: Columns = {
    "start": lambda s: s["start"],
    "layout": lambda s: s["layout"],
    "rows a step": lambda s: s["rows_per_step"],
    "steps": lambda s: s["steps"],
    "exact match": lambda s: f"{s['exact_match']:.1f}",
    "F1": lambda s: f"{s['f1']:.1f}",
    "F1 of each seed": lambda s: ", ".join(f"{f:.1f}" for f in s["f1_runs"]),
}
SQUAD_SPEED_COLUMNS: Columns = {
    "windows": lambda s: s["name"],
    "packing factor": lambda s: f"{s['packing_factor']:.2f}",
    "rows a step (padded / packed)": lambda s: "{padded} / {packed}".format(**s["rows_per_step"]),
    "sequences/s (padded / packed)": lambda s: "{padded:.1f} / {packed:.1f}".format(
        **s["sequences_per_second"]
    ),
    "step speed-up": lambda s: times(s["speedup"]),
    "of the packing factor": lambda s: f"{s['speedup_over_packing_factor']:.2f}",
}


def squad_block(read: Read) -> str:
    r = read("squad_packed_vs_padded")["result"]
    runs = [
        {"start": start, "layout": layout, **entry}
        for key, entry in r["cloze"].items()
        for start, layout in [key.split("/")]
    ]
    speeds = [{"name": name, **s} for name, s in r["speed"].items()]
    questions = f"{r['train_examples']:,} training questions" if r["train_examples"] else "all"
    return (
        f"{source('squad_packed_vs_padded', read)}\n\nThe cloze set ({questions}; the "
        f"evaluation on every dev question), best evaluation, median of {r['seeds']} seeds "
        f"(answering with the context's first name or number: F1 {runs[0]['baseline_f1']:.1f}; "
        f"packing factor of the training windows {runs[-1]['packing_factor']:.2f}):\n\n"
        f"{items_table(runs, SQUAD_COLUMNS)}\n\nTrain steps timed side by side:\n\n"
        f"{items_table(speeds, SQUAD_SPEED_COLUMNS)}"
    )


LABEL_EFFICIENCY_COLUMNS: Columns = {
    "labelled examples": lambda s: f"{s['train_examples']:,}",
    "steps": lambda s: s["steps"],
    "pre-trained": lambda s: f"{s['pretrained']:.4f}",
    "random": lambda s: f"{s['random']:.4f}",
    "gain (points)": lambda s: points(s["gain"]),
    "test: pre-trained": lambda s: f"{s['pretrained_test']:.4f}",
    "test: random": lambda s: f"{s['random_test']:.4f}",
    "test gain": lambda s: points(s["test_gain"]),
}


def label_efficiency_block(read: Read) -> str:
    r = read("label_efficiency")["result"]
    rates = ", ".join(f"{start} {rate:g}" for start, rate in r["learning_rates"].items())
    return (
        f"{source('label_efficiency', read)}\n\nValidation accuracy (the whole split; the "
        f"majority class scores {r['baseline']:.4f}), median of {r['seeds']} seeds; learning "
        f"rates {rates}, each start's best of {r['grid']} at {r['tune_size']:,} examples; "
        f"{r['epochs']:g} epoch, at least {r['min_steps']} steps:\n\n"
        f"{items_table(r['sizes'], LABEL_EFFICIENCY_COLUMNS)}"
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


BLOCK_SPARSE_COLUMNS: Columns = {
    "implementation": lambda c: c["impl"],
    "block": lambda c: c["block_size"],
    "density": lambda c: f"{c['density']:.0%}",
    "dense forward (ms)": lambda c: c["fwd_dense_ms"],
    "sparse forward (ms)": lambda c: c.get("fwd_sparse_ms", "-"),
    "forward speed-up": lambda c: times(c["fwd_speedup"]),
    "dense forward+backward (ms)": lambda c: c["fwd_bwd_dense_ms"],
    "sparse forward+backward (ms)": lambda c: c.get("fwd_bwd_sparse_ms", "-"),
    "forward+backward speed-up": lambda c: times(c["fwd_bwd_speedup"]),
}


def block_sparse_block(read: Read) -> str:
    cases = [
        c for name in ("block_sparse_bench", SECOND_RUN) for c in read(name)["result"]["cases"]
    ]
    side = cases[0]["features"]
    return (
        f"{source('block_sparse_bench', read)}\n\n{source(SECOND_RUN, read)} (its row is the "
        f"last)\n\n{side}x{side} weights, float32:\n\n{items_table(cases, BLOCK_SPARSE_COLUMNS)}"
    )


def whole(value: float) -> str:
    return f"{value:,.0f}"


def mb(value: float) -> str:
    return f"{value:,.0f} MB"


def plus_minus(ratio: float, relative_error: float, digits: int = 2) -> str:
    """A ratio and its standard error (recorded relative, shown absolute)."""
    return f"{ratio:.{digits}f} ± {ratio * relative_error:.{digits}f}"


def either(value: object, spec: str) -> str:
    """`value` formatted, "-" where a file does not record it."""
    return "-" if value is None else format(value, spec)


def pipeline_rate(mode: str, key: str) -> Callable[[dict], str]:
    return lambda r: whole(r["pipeline"][mode][key])


DEMAND = "accelerator_demand_seq_per_s"  # BERT-base seq/s of one A100: the script's estimate
PIPELINE_THROUGHPUT_COLUMNS: Columns = {
    "L": lambda r: r["length"],
    "examples created/s, 1 / 2 workers": lambda r: " / ".join(
        whole(c["examples_per_s"]) for c in r["creation"]
    ),
    "padded rows/s": pipeline_rate("padded", "rows_per_s"),
    "packed rows/s": pipeline_rate("packed", "rows_per_s"),
    "packed seq/s": pipeline_rate("packed", "sequences_per_s"),
    "streaming seq/s": pipeline_rate("streaming", "sequences_per_s"),
    "packed rows per CPU-second": pipeline_rate("packed", "rows_per_cpu_s"),
    "efficiency achieved / predicted (padded)": lambda r: (
        "{achieved:.2f}% / {predicted:.2f}% ({padded:.1f}%)".format(**r["efficiency"])
    ),
    "BERT-base, 1x A100 seq/s": lambda r: f"~{whole(float(f'{r[DEMAND]:.2g}'))}",
    "headroom": lambda r: times(r["pipeline"]["packed"]["sequences_per_s"] / r[DEMAND]),
}


def pipeline_throughput_block(read: Read) -> str:
    lengths = read("pipeline_bench_throughput")["result"]["lengths"]
    items = [{"length": length, **r} for length, r in lengths.items()]
    table = items_table(items, PIPELINE_THROUGHPUT_COLUMNS)
    return f"{source('pipeline_bench_throughput', read)}\n\n{table}"


def by_workers(r: dict, key: str) -> list[float]:
    return [r["workers"][w][key] for w in ("1", "2")]


def pipeline_scale_block(read: Read) -> str:
    scale = read("pipeline_bench")["result"]["scale"]
    items = [{"examples": int(size), **r} for size, r in scale.items()]
    positions = " / ".join(whole(int(rows)) for rows in items[0]["resume_seconds"])
    near, far = lambda r: r["resume_seconds"]["0"], lambda r: list(r["resume_seconds"].values())[-1]
    rows = lambda r: by_workers(r, "rows_per_s")
    columns: Columns = {
        "split": lambda r: whole(r["examples"]),
        "windows": lambda r: r["windows"],
        "peak RSS (imports alone)": lambda r: (
            f"{mb(r['peak_rss_mb'])} ({mb(r['baseline_rss_mb'])})"
        ),
        "pipeline's own": lambda r: mb(r["peak_rss_mb"] - r["baseline_rss_mb"]),
        "efficiency windowed / whole split": lambda r: (
            f"{r['efficiency_windowed']:.3f}% / {r['efficiency_whole_split']:.3f}%"
        ),
        "rows/s 1 worker / 2 workers": lambda r: "{} / {} ({})".format(
            *map(whole, rows(r)), times(rows(r)[1] / rows(r)[0])
        ),
        "rows per CPU-s": lambda r: " / ".join(map(whole, by_workers(r, "rows_per_cpu_s"))),
        f"resume at {positions} rows": lambda r: (
            f"{near(r):.2f} s / {far(r):.2f} s ({times(far(r) / near(r))})"
        ),
    }
    return f"{source('pipeline_bench', read)}\n\n{items_table(items, columns)}"


PREPARE_COLUMNS: Columns = {
    "documents": lambda s: whole(s["documents"]),
    "examples": lambda s: whole(s["examples"]),
    "records": lambda s: mb(s["record_mb"]),
    "conversion to TFDS: peak RSS": lambda s: mb(s["convert_peak_rss_mb"]),
    "examples phase: peak RSS": lambda s: mb(s["peak_rss_mb"]),
    "previous design: peak RSS": lambda s: mb(s["reference_peak_rss_mb"]),
    "examples/s ours / previous": lambda s: (
        f"{whole(s['examples_per_s'])} / {whole(s['reference_examples_per_s'])} "
        f"({s['examples_per_s'] / s['reference_examples_per_s']:.2f})"
    ),
}
BEAM_MODES = {
    "direct": "in-process (`DirectRunner`)",
    "direct_2_processes": "2 processes (`--direct_num_workers=2 "
    "--direct_running_mode=multi_processing`)",
}
BEAM_COLUMNS: Columns = {
    "Beam mode": lambda b: BEAM_MODES[b["mode"]],
    "local examples/s": lambda b: whole(b["local_examples_per_s"]),
    "Beam examples/s": lambda b: whole(b["beam_examples_per_s"]),
    "Beam / local": lambda b: f"{b['beam_over_local']:.2f}",
    "byte-identical": lambda b: "yes" if b["identical"] else "no",
}


def prepare_block(read: Read) -> str:
    r = read("prepare_bench")["result"]
    beam = [{"mode": mode, **b} for mode, b in r["beam"].items()]
    return (
        f"{source('prepare_bench', read)}\n\nPeak resident memory of each phase (the imports "
        f"alone: {mb(r['imports_rss_mb'])}):\n\n{items_table(r['sizes'], PREPARE_COLUMNS)}\n\n"
        f"Beam on the smallest corpus, each run right after the local runner:\n\n"
        f"{items_table(beam, BEAM_COLUMNS)}"
    )


MODEL_COLUMNS: Columns = {
    "model": lambda r: r["model"],
    "L": lambda r: r["length"],
    "layout": lambda r: r["layout"],
    "rows": lambda r: r["rows"],
    "seqs/step": lambda r: f"{r['sequences']:.0f}",
    "fill": lambda r: f"{r['fill']:.0%}",
    "fwd ms": lambda r: whole(r["fwd_ms"]),
    "fwd+bwd ms": lambda r: whole(r["train_ms"]),
    "GFLOP/step": lambda r: f"{r['train_gflop']:.4g}",
    "util fwd / fwd+bwd": lambda r: f"{r['fwd_utilisation']:.2f} / {r['train_utilisation']:.2f}",
    "seq/s (fwd+bwd)": lambda r: f"{1e3 * r['sequences'] / r['train_ms']:.3g}",
}


def model_bench_block(read: Read) -> str:
    r = read("model_bench")["result"]
    padded = {(x["model"], x["length"]): x for x in r["results"] if x["layout"] == "padded"}
    rate = lambda x: x["sequences"] / x["train_ms"]
    over_padded = lambda x: times(rate(x) / rate(padded[x["model"], x["length"]]))
    columns: Columns = {
        **MODEL_COLUMNS,
        "packed / padded seq/s": lambda x: "-" if x["layout"] == "padded" else over_padded(x),
    }
    return (
        f"{source('model_bench', read)}\n\nDense float32 matmul measured at "
        f"{r['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s (utilisation's denominator):\n\n"
        f"{items_table(r['results'], columns)}"
    )


STEP_COST_RUNS = ("step_cost_first_run", "step_cost")  # transcribed: two runs the same day


def step_cost_block(read: Read) -> str:
    items = [
        {"run": read(name)["date"], "layout": layout, **read(name)["result"]}
        for name in STEP_COST_RUNS
        for layout in read(name)["result"]["step_ms"]
    ]
    at = lambda r, key: r[key][r["layout"]]
    line = lambda r: at(r, "fixed_ms") + at(r, "per_row_ms") * at(r, "recipe_rows")
    columns: Columns = {
        "run": lambda r: r["run"],
        "layout": lambda r: r["layout"],
        **{
            f"{rows} rows": (lambda r, rows=rows: at(r, "step_ms")[rows])
            for rows in items[0]["step_ms"]["packed"]
        },
        "fixed ms a step": lambda r: at(r, "fixed_ms"),
        "ms a row": lambda r: at(r, "per_row_ms"),
        "fixed share at the recipe's rows": lambda r: share(at(r, "fixed_ms") / line(r)),
        "recipe's step: speed-up": lambda r: (
            f"{times(r['recipe_speedup'])} = {r['recipe_speedup_over_packing_factor']:.2f} p"
            if r["layout"] == "packed"
            else ""
        ),
    }
    sources = "\n\n".join(source(name, read) for name in STEP_COST_RUNS)
    r = items[-1]
    return (
        f"{sources}\n\nMedian step ms by rows a step, {r['optimizer'].upper()}; the recipe's step "
        f"is {r['recipe_rows']['padded']} padded rows or {r['recipe_rows']['packed']} packed "
        f"(packing factor p = {r['packing_factor']}):\n\n{items_table(items, columns)}"
    )


FIRST_ORDER = ("adamw", "lamb")
RACES = ("optimizer_race", "optimizer_race_short_documents")  # on the plateau; short documents
STUDY_COLUMNS: Columns = {
    "final eval MLM loss": lambda row: f"{row['final_eval_mlm_loss']:.3f}",
    "s/step": lambda row: either(row.get("step_seconds"), ".3f"),
    "host wait s/step": lambda row: either(row.get("host_wait_seconds_per_step"), ".3g"),
}


def steps_to(row: dict) -> str:
    return "never" if row["steps_to_target"] == float("inf") else f"{row['steps_to_target']:g}"


def optimizer_race_block(name: str) -> Callable[[Read], str]:
    """The block of one optimizer_race.py run: the race, then Shampoo's studies, if any."""

    def block(read: Read) -> str:
        r = read(name)["result"]
        table = [{"optimizer": optimizer, **row} for optimizer, row in r["table"].items()]
        first = min(FIRST_ORDER, key=lambda n: r["table"][n]["seconds_to_target"])
        vs = lambda row, key: row[key] / r["table"][first][key]
        columns: Columns = {
            "optimizer": lambda row: row["optimizer"],
            "lr, warm-up": lambda row: f"{row['learning_rate']:g}, {row['warmup']}",
            "steps to target": steps_to,
            "s to target": lambda row: f"{row['seconds_to_target']:.1f}",
            f"steps / seconds vs {first}": lambda row: (
                f"{vs(row, 'steps_to_target'):.2f}x / {vs(row, 'seconds_to_target'):.2f}x"
            ),
            **STUDY_COLUMNS,
            "state bytes/param": lambda row: either(row.get("state_bytes_per_param"), ".1f"),
        }
        studies = [
            {"study": study, "setting": setting, **row}
            for study in ("ablation", "staleness", "max_staleness")
            for setting, row in r[study].items()
        ]
        text = (
            f"{source(name, read)}\n\nTarget eval MLM loss {r['target']}; step times side by "
            f"side: asynchronous Shampoo over LAMB {r['async_over_lamb_step_time']:.3f} (± "
            f"{r['async_over_lamb_step_time_error']:.1%}), synchronous roots over asynchronous "
            f"{r['sync_over_async_step_time']:.2f}:\n\n{items_table(table, columns)}"
        )
        if studies:
            shampoo = {"study": lambda s: s["study"], "setting": lambda s: s["setting"]}
            text += (
                "\n\nShampoo's winner (seed 0) with one setting changed:\n\n"
                f"{items_table(studies, {**shampoo, **STUDY_COLUMNS})}"
            )
        return text

    return block


def time_to_accuracy_race_block(read: Read) -> str:
    race = read("time_to_accuracy")["result"]["race"]
    rows = [{"by": by, "rows": race.get(f"by_{by}")} for by in ("steps", "seconds")]
    named = lambda row, i: row["rows"][i] if row["rows"] else "not recorded"
    columns: Columns = {
        "to target": lambda row: row["by"],
        "best first-order row": lambda row: named(row, 0),
        "best second-order row": lambda row: named(row, 1),
        "second-order over first-order": lambda row: times(
            race[f"{row['by']}_second_over_first_order"]
        ),
    }
    return (
        f"{source('time_to_accuracy', read)}\n\nIts `race`: the best second-order packed row "
        f"against the best first-order one:\n\n{items_table(rows, columns)}"
    )


LOSS_TIMES: Columns = {
    "optax + argmax": lambda r: f"{r['reference_ms']:.1f} ms",
    "one max": lambda r: f"{r['ours_ms']:.1f} ms",
}
LOSS_SHAPE_COLUMNS: Columns = {
    "masked positions x vocabulary": lambda r: (
        f"{r['shape']}: {whole(r['positions'])} x {whole(r['vocab'])}"
    ),
    **LOSS_TIMES,
    "speed-up": lambda r: plus_minus(r["speedup"], r["speedup_error"]),
}
LOSS_STEP_COLUMNS: Columns = {
    "config": lambda r: r["config"],
    **LOSS_TIMES,
    "speed-up": lambda r: plus_minus(r["speedup"], r["speedup_error"], 3),
}


def loss_bench_block(read: Read) -> str:
    shapes = [{"shape": shape, **r} for shape, r in read("loss_bench")["result"].items()]
    steps = [{"config": config, **r} for config, r in read("loss_bench_steps")["result"].items()]
    return (
        f"{source('loss_bench', read)}\n\nThe loss, its accuracy and its gradient with respect "
        f"to the logits:\n\n{items_table(shapes, LOSS_SHAPE_COLUMNS)}\n\n"
        f"{source('loss_bench_steps', read)}\n\nThe whole train step of `configs/<config>.py`:"
        f"\n\n{items_table(steps, LOSS_STEP_COLUMNS)}"
    )


DROPOUT_COLUMNS: Columns = {
    "setting": lambda r: r["setting"],
    "dropout bits": lambda r: r["variant"],
    "step ms (side by side)": lambda r: either(r.get("step_ms"), ".1f"),
    "step ms (profiled)": lambda r: either(r.get("profiled_step_ms"), ".1f"),
    "dropout share of step": lambda r: share(r["dropout_share"]) if "dropout_share" in r else "-",
    "speed-up vs threefry": lambda r: plus_minus(r["speedup"], r["speedup_error"], 3),
}
DROPOUT_RUNS = ("profile_report_dropout", "profile_report_dropout_second_run")


def dropout_block(read: Read) -> str:
    return "\n\n".join(
        f"{source(name, read)}\n\n{items_table(read(name)['result']['rows'], DROPOUT_COLUMNS)}"
        for name in DROPOUT_RUNS
    )


def rate_factor(item: tuple[str, float]) -> float:
    return float(item[0])


def block_sparse_learning_block(read: Read) -> str:
    r = read("block_sparse_learning")["result"]
    settings = [{"name": name, **figures} for name, figures in r["settings"].items()]
    dense = r["settings"]["dense"]
    columns: Columns = {
        "FFN": lambda s: s["name"],
        "parameters": lambda s: f"{s['parameters']:,}",
        "learning rate": lambda s: f"{s['learning_rate']:g}",
        "step (ms)": lambda s: f"{1e3 * s['step_seconds']:.0f}",
        "FFN blocks (ms)": lambda s: f"{1e3 * s['ffn_seconds']:.1f}",
        "FFN time / dense (same FLOPs)": lambda s: times(s["ffn_seconds"] / dense["ffn_seconds"]),
        "steps in the minutes": lambda s: f"{s['steps']:,.0f}",
        f"accuracy at {r['minutes']:g} min": lambda s: f"{s['accuracy_equal_seconds']:.4f}",
        "accuracy at equal steps (dense's; step)": lambda s: (
            f"{s['accuracy_equal_steps']:.4f} ({s['dense_accuracy_equal_steps']:.4f}; "
            f"{s['equal_steps']:,})"
        ),
        "seeds": lambda s: s["seeds"],
    }
    grid = "; ".join(
        f"{name} "
        + ", ".join(f"{f} x: {a:.4f}" for f, a in sorted(by_factor.items(), key=rate_factor))
        for name, by_factor in r["learning_rate_grid"].items()
        if len(by_factor) > 1
    )
    return (
        f"{source('block_sparse_learning', read)}\n\nEval masked-LM accuracy (most-frequent-token "
        f"baseline {r['baseline']:.4f}), medians over seeds; blocks of {r['block_size']}. Best "
        f"sparse setting {r['best_sparse']}: {points(r['gain_equal_seconds'])} points against "
        f"dense at equal seconds, {points(r['gain_equal_steps'])} at equal steps.\n\n"
        f"{items_table(settings, columns)}\n\nLearning-rate grid (seed 0, accuracy at equal "
        f"seconds by factor of the recipe's rate): {grid}."
    )


def demo_block(read: Read) -> str:
    record = read("demo")
    return (
        f"`make demo`'s summary, one run ({record['date']}, {machine_text(record['machine'])}; "
        f"`benchmarks/results/demo.json`):\n\n```\n{record['result']['summary']}\n```"
    )


ATTENTION_DROPOUT_COLUMNS: Columns = {
    "attention dropout": lambda r: r["rate"],
    "eval masked-LM accuracy, median": lambda r: f"{r['median']:.4f}",
    "min": lambda r: f"{min(r['seeds']):.4f}",
    "max": lambda r: f"{max(r['seeds']):.4f}",
}


def attention_dropout_block(read: Read) -> str:
    result = read("attention_dropout")["result"]
    rows = [
        {"rate": rate, "median": result["median"][rate], "seeds": seeds}
        for rate, seeds in result["accuracy"].items()
    ]
    return (
        f"{source('attention_dropout', read)}\n\nThe packed CPU recipe at step "
        f"{result['steps']}, {result['seeds']} seeds (most-frequent-token baseline "
        f"{result['baseline']:.4f}):\n\n{items_table(rows, ATTENTION_DROPOUT_COLUMNS)}"
    )


def compile_block(read: Read) -> str:
    import compile_table  # JAX and libtpu: only for this block

    return compile_table.rendered(read("compile_table"))


BLOCKS: dict[str, Callable[[Read], str]] = {
    "readme": readme_table,
    "demo": demo_block,
    "packing_bench": packing_block,
    "packed_vs_padded": packed_vs_padded_block,
    "time_to_accuracy": time_to_accuracy_block,
    "time_to_accuracy_rerun": time_to_accuracy_rerun_block,
    **{name: cpu_pretrain_block(name) for name in CPU_RUNS},
    "learning_curves": learning_curves_block,
    "finetune_packed_vs_padded": finetune_block,
    "label_efficiency": label_efficiency_block,
    "squad_packed_vs_padded": squad_block,
    "profile_report": profile_block,
    "block_sparse_bench": block_sparse_block,
    "block_sparse_learning": block_sparse_learning_block,
    "compile_table": compile_block,
    "pipeline_bench_throughput": pipeline_throughput_block,
    "pipeline_bench": pipeline_scale_block,
    "prepare_bench": prepare_block,
    "model_bench": model_bench_block,
    "step_cost": step_cost_block,
    "time_to_accuracy_race": time_to_accuracy_race_block,
    **{name: optimizer_race_block(name) for name in RACES},
    "loss_bench": loss_bench_block,
    "profile_report_dropout": dropout_block,
    "attention_dropout": attention_dropout_block,
}


def published(name: str) -> dict:
    return read(name, PUBLISHED)


def doc_paths() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def render(text: str, path: str, read: Read = published) -> tuple[str, list[str]]:
    """`text` with every block rendered afresh, and the names of the blocks that changed."""
    changed = []

    def block(match: re.Match) -> str:
        opening, name, old, closing = match.groups()
        if name not in BLOCKS:
            raise ValueError(f"{path}: no block named {name!r}; the names are {sorted(BLOCKS)}")
        new = "\n" + BLOCKS[name](read) + "\n\n"
        if new != old:
            changed.append(name)
        return opening + new + closing

    return BLOCK.sub(block, text), changed


def update_docs(write: bool) -> list[tuple[str, str]]:
    """(doc, block) for every block that differs from its rendering; with `write`, rewritten."""
    changed = []
    for path in doc_paths():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new, names = render(text, path)
        changed += [(os.path.relpath(path, ROOT), name) for name in names]
        if write and names:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
    return changed
