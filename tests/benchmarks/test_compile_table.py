"""The TPU table: its fit over layers and rows (tests/benchmarks/test_results.py keeps
docs/compile.md equal to its JSON)."""

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


def test_the_markdown_command_prints_the_docs_block(load_benchmark):
    done = subprocess.run(
        [sys.executable, "benchmarks/compile_table.py", "--markdown"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    tables = load_benchmark("results_tables")
    assert done.stdout.strip() == tables.BLOCKS["compile_table"](tables.published)


def test_a_rerun_resumes_cells_of_its_method_and_drops_others(load_benchmark, tmp_path):
    bench = load_benchmark("compile_table")
    path = str(tmp_path / "compile_table.json")
    bench.save({"method": bench.METHOD, "cells": [{"cell": 1}], "check": {"x": 1}}, path)
    assert bench.load(path)["cells"] == [{"cell": 1}]
    bench.save({"method": "an older method", "cells": [{"cell": 1}], "check": {"x": 1}}, path)
    assert bench.load(path) == {"method": bench.METHOD, "cells": [], "check": {"x": 1}}


def test_the_published_table_is_of_the_current_method(load_benchmark):
    bench = load_benchmark("compile_table")
    assert bench.load(bench.RESULTS)["cells"], "the published cells would be dropped on a rerun"
