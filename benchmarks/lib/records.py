"""Published results: one file per result under benchmarks/results/, from which the README's
headline table and every figure block of the docs are rendered (`blocks.py`).

A benchmark run with --json ends with `publish(name, result)`: it writes `<name>.json`, holding
the command, the date (UTC), the machine, the commit (`+dirty` for uncommitted changes) and the
result, then prints the result as its last line. `python -m benchmarks --publish_run` does the \
    same for a training
run's final metrics (its `final_metrics.json`) or a demo's summary (`demo_summary.json`).
BENCHMARK_RESULTS_DIR moves the files elsewhere (the tests do, so that their small runs never
overwrite a published result).
"""

from __future__ import annotations

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

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED = os.path.join(BENCHMARKS, "results")
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


def now() -> str:
    """The time in UTC, to the second, as a results file records it."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def commit(root: str = os.path.dirname(BENCHMARKS)) -> str:
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
    """Writes `<name>.json` (command, date, machine, commit, result); returns its path. A file
    already there is a run this one replaces: it moves, with its own, to `earlier_runs`."""
    record = {
        "command": command,
        "date": now(),
        "machine": machine(),
        "commit": commit(),
        "result": result,
    }
    os.makedirs(results_dir(), exist_ok=True)
    path = os.path.join(results_dir(), f"{name}.json")
    if os.path.exists(path):  # a rerun: the run it replaces stays in the file, dated
        earlier = read(name)
        record["earlier_runs"] = [*earlier.pop("earlier_runs", []), earlier]
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return path


def module_name(path: str) -> str:
    """`.../benchmarks/studies/<name>.py` -> `benchmarks.studies.<name>`: how it is run."""
    parts = os.path.normpath(path).removesuffix(".py").split(os.sep)
    return ".".join(parts[len(parts) - 1 - parts[::-1].index("benchmarks") :])


def publish(name: str, result: dict, argv: Sequence[str] | None = None) -> None:
    """A benchmark's final result: written to `<name>.json` with the command line `argv`
    (default `sys.argv`), then printed as one JSON line."""
    argv = sys.argv if argv is None else argv
    command = shlex.join(["python", "-m", module_name(argv[0]), *argv[1:]])
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
    from bert_flax.runs import finished

    demo_summary = os.path.join(workdir, demo.DEMO_SUMMARY_FILE)
    if os.path.exists(demo_summary):
        with open(demo_summary) as f:
            return write(name, command, json.load(f))
    final = finished.ended_run(workdir)
    if final is None:
        raise SystemExit(f"{workdir}: no run that ended on its own (final_metrics.json)")
    return write(name, command, final)


def read(name: str, directory: str | None = None) -> dict:
    """The results file `<name>.json` of `directory` (default `results_dir()`)."""
    with open(os.path.join(directory or results_dir(), f"{name}.json")) as f:
        return json.load(f)
