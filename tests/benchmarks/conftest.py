"""Fixtures for the benchmark tests: a benchmark script imported as a module."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def _load(name: str) -> ModuleType:
    if BENCHMARKS not in sys.path:  # as when run as a script: it imports its neighbours (results)
        sys.path.append(BENCHMARKS)
    path = os.path.join(BENCHMARKS, f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """``load_benchmark(name)``: ``benchmarks/<name>.py`` as a module (not a package)."""
    return _load
