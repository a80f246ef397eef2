r"""Published results: one file per result under benchmarks/results/, from which the README's
headline table and every figure block of the docs are rendered (`results_tables.py`).

    python benchmarks/results.py --docs       # rewrites the docs' blocks from the files
    python benchmarks/results.py --check      # names the blocks that differ from their files
    python benchmarks/results.py --publish_run=workdir/cpu_soap --name=cpu_pretrain_soap \
        --command="python -m bert_flax.train --config=configs/cpu_pretrain_soap.py ..."
    python benchmarks/results.py --publish_run=workdir/demo --name=demo --command="make demo"

A benchmark run with --json ends with `publish(name, result)`: it writes `<name>.json`, holding
the command, the date (UTC), the machine, the commit (`+dirty` for uncommitted changes) and the
result, then prints the result as its last line. `--publish_run` does the same for a training
run's final metrics (its `final_metrics.json`) or a demo's summary (`demo_summary.json`).
BENCHMARK_RESULTS_DIR moves the files elsewhere (the tests do, so that their small runs never
overwrite a published result).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
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


def finish(name: str, result: dict, plot: str, copy_plot_to: str, as_json: bool) -> None:
    """A benchmark's last lines: its plot named (and copied to `copy_plot_to` when given), then
    with `as_json` its result published."""
    if copy_plot_to:
        shutil.copyfile(plot, copy_plot_to)
    print(f"plot: {plot}")
    if as_json:
        publish(name, result)


def publish_run(workdir: str, name: str, command: str) -> str:
    """A training run's final metrics (a run that ended on its own), or the summary of a demo
    (`make demo`'s workdir), as `<name>.json`."""
    from bert_flax import demo
    from bert_flax.train import loop  # TensorFlow and JAX: only for this

    demo_summary = os.path.join(workdir, demo.DEMO_SUMMARY_FILE)
    if os.path.exists(demo_summary):
        with open(demo_summary) as f:
            return write(name, command, json.load(f))
    final = loop.ended_run(workdir)
    if final is None:
        raise SystemExit(f"{workdir}: no run that ended on its own (final_metrics.json)")
    return write(name, command, final)


def read(name: str, directory: str | None = None) -> dict:
    """The results file `<name>.json` of `directory` (default `results_dir()`)."""
    with open(os.path.join(directory or results_dir(), f"{name}.json")) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", action="store_true", help="Rewrite the docs' result blocks.")
    parser.add_argument("--check", action="store_true", help="Name the blocks that differ.")
    parser.add_argument("--publish_run", metavar="WORKDIR", help="A run's final metrics.")
    parser.add_argument("--name", help="--publish_run: the results file's name.")
    parser.add_argument("--command", help="--publish_run: the command that trained the run.")
    args = parser.parse_args()
    if args.publish_run:
        if not (args.name and args.command):
            parser.error("--publish_run needs --name and --command")
        print(publish_run(args.publish_run, args.name, args.command))
    if args.docs or args.check:
        import results_tables  # renders with what the benchmarks import

        changed = results_tables.update_docs(write=args.docs)
        for path, name in changed:
            print(f"{path}: block {name} {'rewritten' if args.docs else 'differs from its file'}")
        if args.check and changed:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
