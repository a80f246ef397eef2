"""Fixtures for the benchmark tests: a benchmark module imported by its name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """``load_benchmark(name)``: the module ``benchmarks.<name>`` ("lib.blocks", "step_cost")."""
    return lambda name: importlib.import_module(f"benchmarks.{name}")
