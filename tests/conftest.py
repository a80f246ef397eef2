"""Settings for every test process: one persistent XLA compilation cache.

Many tests (the journeys, fault and benchmark smoke runs, the notebook) start fresh Python
processes that compile the same tiny-model steps; they inherit these variables, so each program
compiles once per machine instead of once per process. Only compilations of at least a second
are cached (the train and eval steps, not the many small helpers). The cache key covers the
program, the XLA flags and the jax version, so a stale entry is never used.
"""

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import pytest

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "bert_flax_tests_xla_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")


@pytest.fixture
def run_on_devices():
    """`run(code, devices, pythonpath=())`: `python -c code` on `devices` simulated CPU devices
    (XLA_FLAGS set before JAX is imported), asserting it exits 0 and prints OK."""

    def run(code: str, devices: int, pythonpath: Sequence[str] = ()) -> None:
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        }
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
        )
        assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-4000:]

    return run
