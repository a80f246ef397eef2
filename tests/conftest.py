"""Settings for every test process: one persistent XLA compilation cache, quick compiles, slow
tests first, the CPU recipe's prepared data made once per test session, and benchmark results
written to a temporary directory (never over the published ones in benchmarks/results/).

Many tests (the journeys, fault and benchmark smoke runs, the notebook) start fresh Python
processes that compile the same tiny-model steps; they inherit these variables, so each program
compiles once per machine instead of once per process. Only compilations of at least a second
are cached (the train and eval steps, not the many small helpers). The cache key covers the
program, the XLA flags and the jax version, so a stale entry is never used.
"""

import fcntl
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from tests.paths import ROOT

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "bert_flax_tests_xla_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
# The tests' models are tiny, so compiling, not running, is most of their CPU time: compile with
# XLA's CPU backend at its lowest optimisation. Every test process compiles alike (the simulated
# device counts go through JAX_NUM_CPU_DEVICES, not XLA_FLAGS), so compared runs stay comparable.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = f"{FAST_COMPILE_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()


@pytest.fixture(scope="session", autouse=True)
def benchmark_results_dir(tmp_path_factory) -> Iterator[str]:
    """Where the benchmarks a test runs publish (BENCHMARK_RESULTS_DIR: benchmarks/lib/records.py),
    inherited by their processes."""
    with pytest.MonkeyPatch.context() as patch:
        directory = str(tmp_path_factory.mktemp("benchmark_results"))
        patch.setenv("BENCHMARK_RESULTS_DIR", directory)
        yield directory


@pytest.fixture
def run_on_devices():
    """`run(worker, devices, *args, timeout=600)`: `python -m worker *args` from the repository
    root on `devices` simulated CPU devices (JAX_NUM_CPU_DEVICES), asserting it exits 0 and prints
    OK within `timeout` seconds. `worker` is a module (`tests.optim.shampoo_sharded_worker`), or
    code, run with `python -c` (block_sparse's, until they move to worker modules)."""

    def run(worker: str, devices: int, *args: str, timeout: float = 600) -> None:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices)}
        program = ["-m", worker] if re.fullmatch(r"[\w.]+", worker) else ["-c", worker]
        done = subprocess.run(
            [sys.executable, *program, *args],
            capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-4000:]

    return run


@pytest.fixture
def free_port() -> int:
    """A TCP port on localhost free now (for a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def expected_seconds(item: pytest.Item) -> float:
    """What `@pytest.mark.slow(seconds=N)` says a test takes in CI (20 when unsaid), else 0."""
    marker = item.get_closest_marker("slow")
    return 0.0 if marker is None else marker.kwargs.get("seconds", 20.0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first: `make test` hands tests to its two workers one at a time
    (`--maxschedchunk=1`) in this order, so that neither ends on a long one while the other
    idles."""
    items.sort(key=expected_seconds, reverse=True)  # stable: the rest keep collection order


@pytest.fixture(scope="session")
def recipe_data(tmp_path_factory) -> str:
    """The bundled corpus prepared as the CPU recipe prepares it (`demo.prepare_data`), with one
    copy of each document (dupe_factor=1): made once per session, whichever test process gets
    there first (the others wait on a lock), and copied by tests that write beside it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the xdist workers of this session
    directory = root / "recipe_data"
    with open(root / "recipe_data.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / "summary.json").exists():
            shutil.rmtree(directory, ignore_errors=True)
            done = subprocess.run(
                [sys.executable, "-c", "import sys; from bert_flax import demo; "
                 "demo.prepare_data(sys.argv[1], dupe_factor=1)", str(directory)],
                capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                timeout=900,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-4000:]
    return str(directory)
