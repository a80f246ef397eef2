"""The step-cost benchmark's line fit: the fixed and per-row parts of a step time."""

from __future__ import annotations

import pytest


def test_fit_line_recovers_the_fixed_and_per_row_cost(load_benchmark):
    bench = load_benchmark("step_cost")
    fixed, per_row = bench.fit_line([4, 8, 16], [45.0 + 30.0 * r for r in (4, 8, 16)])
    assert fixed == pytest.approx(45.0) and per_row == pytest.approx(30.0)
