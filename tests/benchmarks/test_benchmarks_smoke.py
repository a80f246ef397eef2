"""Benchmarks as a user types them, on tiny settings: they run to their JSON line, and what they
report is well formed. Their figures come from full runs (docs/); this only keeps the scripts
from breaking unnoticed. Only packed_vs_padded is here (its learning case once broke unseen):
the multi-process benchmarks (prepare_bench's Beam modes) would oversubscribe CI's two cores
while timing-sensitive journeys run, and their stages are tested directly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_benchmark(name: str, *args: str) -> dict:
    command = [sys.executable, os.path.join(ROOT, "benchmarks", name), *args, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_packed_vs_padded_with_its_learning_case(tmp_path):
    result = run_benchmark(
        "packed_vs_padded.py",
        "--rounds=1",
        "--steps=1",
        "--sample_rows=32",
        "--learn_steps=4",
        "--learn_rows=4",
        f"--learn_data_dir={tmp_path / 'learn'}",
    )
    assert [case["case"] for case in result["cases"]] == ["wikipedia-like 512", "SQuAD 1.1 384"]
    for case in result["cases"]:  # no speed is asserted here: timing belongs to full runs
        assert case["speedup"] > 0 and case["batch_packing_factor"] > 1.5
    learning = result["learning"]
    assert learning["padded"]["steps"] == 4 and learning["packed"]["steps"] < 4
    assert learning["packing_factor"] > 1.5
