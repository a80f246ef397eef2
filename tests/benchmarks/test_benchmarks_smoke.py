"""The benchmarks as a user types them, on tiny settings: they run to their JSON line, and what
they report is well formed (Beam output byte-identical, packing factors of the samples). Their
figures come from full runs (docs/); these only keep the scripts from breaking unnoticed."""

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
def test_prepare_bench_grows_sizes_and_beam_writes_the_same_bytes(tmp_path):
    result = run_benchmark(
        "prepare_bench.py",
        f"--workdir={tmp_path}",
        "--documents=40,80",
        "--paragraphs=4",
        "--documents_per_bucket=10",
        "--documents_per_shard=20",
    )
    small, large = result["sizes"]
    assert large["examples"] > small["examples"] > 0 and large["shards"] == 2 * small["shards"]
    assert all(mode["identical"] for mode in result["beam"].values())
    assert set(result["beam"]) == {"direct", "direct_2_processes"}


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
