"""The TPU table: its fit over layers and rows, and docs/compile.md showing exactly its JSON."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fit_recovers_a_bilinear_figure_and_reads_it_at_depth(load_benchmark):
    bench = load_benchmark("compile_table")

    def figure(layers, rows):  # fixed + per layer + per row + per layer-row (activations)
        return 5.0 + 3.0 * layers + 2.0 * rows + 0.5 * layers * rows

    points = {
        (layers, rows): {name: figure(layers, rows) for name in bench.FITTED}
        for layers in bench.LAYERS
        for rows in (16, 32)
    }
    at_depth = bench.at(bench.fit(points), 24, 100)
    assert at_depth["memory"] == pytest.approx(figure(24, 100))


def test_the_docs_table_is_the_benchmarks_json():
    done = subprocess.run(
        [sys.executable, "benchmarks/compile_table.py", "--markdown"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.strip()
    assert table.count("\n") >= 3, table  # a header, its rule and rows
    with open(os.path.join(ROOT, "docs", "compile.md"), encoding="utf-8") as f:
        assert table in f.read(), "docs/compile.md: paste `compile_table.py --markdown` again"
