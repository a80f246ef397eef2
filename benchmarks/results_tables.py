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


def profile_row(read: Read) -> tuple[str, str]:
    lamb = [s for s in read("profile_report")["result"]["settings"] if s["label"].endswith("lamb")]
    span = lambda key: "-".join(f"{100 * f(s[key] for s in lamb):.0f}" for f in (min, max))
    return "where a step's time goes (profiler, LAMB settings)", (
        f"non-matmul work {span('non_matmul_share')}% of the step, nearly all memory-bound by "
        f"the roofline; matrix products {span('matmul_share')}%"
    )


def compile_row(read: Read) -> tuple[str, str]:
    cells = read("compile_table")["cells"]
    listed = lambda key: list(dict.fromkeys(c[key] for c in cells))
    models = " and ".join(f"BERT-{m}" for m in listed("model"))
    layouts = " and ".join("packed" if p else "padded" for p in listed("packed"))
    return (
        "will it fit, how fast could it be (compiled for TPU on this CPU host; **predictions**: "
        "roofline, not measured)",
        f"{models}, {layouts}, on {', '.join(listed('target'))}: fits, largest batch, HBM, "
        "FLOPs, collectives, step time, sequences/s (predictions from compiles)",
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
        "`python -m bert_flax.main --config=configs/cpu_pretrain_soap.py "
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
        block_sparse_row,
        "`python benchmarks/block_sparse_bench.py --impls=cpu,xla` "
        "([results](docs/results.md#block-sparse))",
    ),
]


def readme_table(read: Read) -> str:
    """The README's table of headline results."""
    return table(
        ["result", "figure", "command (details)"],
        [[*render(read), command] for render, command in README_ROWS],
    )


# The results page's blocks: each shows one file whole (the block-sparse one, with its second run).

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


def demo_block(read: Read) -> str:
    record = read("demo")
    return (
        f"`make demo`'s summary, one run ({record['date']}, {machine_text(record['machine'])}; "
        f"`benchmarks/results/demo.json`):\n\n```\n{record['result']['summary']}\n```"
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
    **{name: cpu_pretrain_block(name) for name in CPU_RUNS},
    "learning_curves": learning_curves_block,
    "finetune_packed_vs_padded": finetune_block,
    "label_efficiency": label_efficiency_block,
    "profile_report": profile_block,
    "block_sparse_bench": block_sparse_block,
    "compile_table": compile_block,
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
