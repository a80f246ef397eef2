r"""Published results: one file per result under benchmarks/results/, and the README's table of
headline results rendered from those files.

    python benchmarks/results.py --readme     # the README's "Headline results" table
    python benchmarks/results.py --publish_run=workdir/cpu_soap --name=cpu_pretrain_soap \
        --command="python -m bert_flax.main --config=configs/cpu_pretrain_soap.py ..."

A benchmark run with --json ends with `publish(name, result)`: it writes `<name>.json`, holding
the command, the date (UTC), the machine, the commit (`+dirty` for uncommitted changes) and the
result, then prints the result as its last line. `--publish_run` does the same for a training
run's final metrics (its `final_metrics.json`). BENCHMARK_RESULTS_DIR moves the files elsewhere
(the tests do, so that their small runs never overwrite a published result).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
PUBLISHED = os.path.join(HERE, "results")
ENV = "BENCHMARK_RESULTS_DIR"
Read = Callable[[str], dict]  # a results file's name -> its contents


def results_dir() -> str:
    """Where results are written and read: $BENCHMARK_RESULTS_DIR, else benchmarks/results/."""
    return os.environ.get(ENV) or PUBLISHED


def machine() -> dict[str, object]:
    """This machine: CPU model, cores, platform and jax version."""
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "jax": metadata.version("jax"),
    }


def commit(root: str = os.path.dirname(HERE)) -> str:
    """The checkout's HEAD, with `+dirty` when it has uncommitted changes; "unknown" outside git."""
    git = lambda *args: subprocess.run(
        ["git", "-C", root, *args], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        head = git("rev-parse", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(name: str, command: str, result: dict) -> str:
    """Writes `<name>.json` (command, date, machine, commit, result); returns its path."""
    record = {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "commit": commit(),
        "result": result,
    }
    os.makedirs(results_dir(), exist_ok=True)
    path = os.path.join(results_dir(), f"{name}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return path


def publish(name: str, result: dict, argv: Sequence[str] | None = None) -> None:
    """A benchmark's final result: written to `<name>.json` with the command line `argv`
    (default `sys.argv`), then printed as one JSON line."""
    argv = sys.argv if argv is None else argv
    command = shlex.join(["python", f"benchmarks/{os.path.basename(argv[0])}", *argv[1:]])
    path = write(name, command, result)
    print(f"published {path}", file=sys.stderr)
    print(json.dumps(result), flush=True)


def publish_run(workdir: str, name: str, command: str) -> str:
    """A training run's final metrics (a run that ended on its own) as `<name>.json`."""
    from bert_flax import train  # TensorFlow and JAX: only for this

    final = train.ended_run(workdir)
    if final is None:
        raise SystemExit(f"{workdir}: no run that ended on its own (final_metrics.json)")
    return write(name, command, final)


def read(name: str, directory: str | None = None) -> dict:
    """The results file `<name>.json` of `directory` (default `results_dir()`)."""
    with open(os.path.join(directory or results_dir(), f"{name}.json")) as f:
        return json.load(f)


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
        "`python benchmarks/packing_bench.py` ([packing](docs/packing.md#benchmark))",
    ),
    (
        packed_vs_padded_row,
        "`python benchmarks/packed_vs_padded.py --json` "
        "([training](docs/training.md#packed-versus-padded))",
    ),
    (
        time_to_accuracy_row,
        "`python benchmarks/time_to_accuracy.py --seeds=3 --grid=3 --target=0.25 --json` "
        "([training](docs/training.md#time-to-accuracy))",
    ),
    (
        cpu_pretrain_row,
        "`python -m bert_flax.main --config=configs/cpu_pretrain_soap.py "
        "--workdir=workdir/cpu_soap --config.data.data_dir=workdir/sotu_cpu` "
        "([training](docs/training.md#a-cpu-pre-training-recipe))",
    ),
    (
        learning_curves_row,
        "`python benchmarks/learning_curves.py --json --recipe=cpu_pretrain --steps=800 "
        "--eval_every=200 --finetune_epochs=1` "
        "([training](docs/training.md#a-cpu-pre-training-recipe))",
    ),
    (
        finetune_row,
        "`python benchmarks/finetune_packed_vs_padded.py --json` "
        "([training](docs/training.md#fine-tuning-and-inference))",
    ),
    (
        profile_row,
        "`python benchmarks/profile_report.py` "
        "([profile](docs/profile.md#what-it-shows-for-bert-pre-training-benchmarksprofile_reportpy))",
    ),
    (
        compile_row,
        "`python benchmarks/compile_table.py` "
        "([compile](docs/compile.md#the-table-before-booking-tpus))",
    ),
    (
        block_sparse_row,
        "`python benchmarks/block_sparse_bench.py --impls=cpu,xla` "
        "([block-sparse](docs/block_sparse.md#benchmark))",
    ),
]


def readme_table(directory: str | None = None) -> str:
    """The README's table of headline results, from the results files in `directory`."""
    lines = ["| result | figure | command (details) |", "|---|---|---|"]
    for render, command in README_ROWS:
        result, figure = render(lambda name: read(name, directory))
        lines.append(f"| {result} | {figure} | {command} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readme", action="store_true", help="Print the README's table.")
    parser.add_argument("--publish_run", metavar="WORKDIR", help="A run's final metrics.")
    parser.add_argument("--name", help="--publish_run: the results file's name.")
    parser.add_argument("--command", help="--publish_run: the command that trained the run.")
    args = parser.parse_args()
    if args.publish_run:
        if not (args.name and args.command):
            parser.error("--publish_run needs --name and --command")
        print(publish_run(args.publish_run, args.name, args.command))
    if args.readme:
        print(readme_table())


if __name__ == "__main__":
    main()
