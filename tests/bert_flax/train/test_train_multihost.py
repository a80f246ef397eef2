"""Two processes under jax.distributed (CPU, localhost) give the same step as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.paths import ROOT

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")


def start(process_id: int, num_processes: int, port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("JAX_NUM_CPU_DEVICES", None)  # one CPU device per process
    return subprocess.Popen(
        [sys.executable, WORKER, str(process_id), str(num_processes), str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen) -> dict:
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow(seconds=40)
def test_two_processes_match_one(free_port):
    procs = [start(0, 1, 0), start(0, 2, free_port), start(1, 2, free_port)]
    reference, *pair = (result(p) for p in procs)
    assert reference["devices"] == 1 and all(r["devices"] == 2 for r in pair)
    for r in pair:
        assert r["sequences"] == reference["sequences"]
        assert r["loss"] == pytest.approx(reference["loss"], rel=1e-5)
        assert r["param_checksum"] == pytest.approx(reference["param_checksum"], rel=1e-5)
