"""The block-sparse learning study's bookkeeping on fake runs: which runs it trains (seed 0 of
every setting, the rate grid for dense and the best sparse setting, their other seeds at the
best rate) and the medians it compares; no training (the smoke test trains one run a side)."""

from __future__ import annotations

import argparse

import pytest

# Seed 0's accuracy at equal seconds per (setting, rate factor); later seeds add 0.001 each.
ACCURACY = {
    ("dense", 1.0): 0.30,
    ("dense", 2.0): 0.32,
    ("sparse25_small", 1.0): 0.31,
    ("sparse25_small", 2.0): 0.29,
    ("sparse10_random", 1.0): 0.25,
}


@pytest.fixture
def bench(load_benchmark, monkeypatch):
    """The study with `run` replaced: each call recorded as (setting, seed, factor), its curve
    evaluated at steps 2, 4 and (dense only) 6."""
    module = load_benchmark("studies.block_sparse_learning")
    monkeypatch.setattr(module, "calls", [], raising=False)

    def fake_run(args, data_dir, setting, seed, factor):
        module.calls.append((setting, seed, factor))
        accuracy = ACCURACY[setting, factor] + 0.001 * seed
        steps = [2, 4, 6] if setting == "dense" else [2, 4]
        accuracies = [accuracy - 0.1, accuracy - 0.05, accuracy][-len(steps) :]
        curve = {"step": steps, module.METRIC: accuracies}
        return {"curve": curve, "final": {"step": steps[-1], "setup": {"params": 100}}}

    monkeypatch.setattr(module, "run", fake_run)
    return module


def test_the_grid_runs_for_dense_and_the_best_sparse_then_their_seeds_at_the_best_rate(bench):
    settings = ["dense", "sparse25_small", "sparse10_random"]
    args = argparse.Namespace(seeds=2)
    seed0, best_sparse, runs = bench.chosen_runs(args, "data", settings, [1.0, 2.0])
    assert best_sparse == "sparse25_small"
    assert bench.calls == [
        ("dense", 0, 1.0),
        ("sparse25_small", 0, 1.0),
        ("sparse10_random", 0, 1.0),
        ("dense", 0, 2.0),
        ("sparse25_small", 0, 2.0),
        ("dense", 1, 2.0),  # dense's best rate is twice the recipe's
        ("sparse25_small", 1, 1.0),
    ]
    assert set(seed0) == {*ACCURACY}
    assert [len(runs[s]) for s in settings] == [2, 2, 1]  # the losing sparse setting: seed 0 only
    assert runs["dense"][0] is seed0["dense", 2.0]


def test_medians_at_equal_seconds_and_at_the_last_step_every_run_evaluated(bench):
    args = argparse.Namespace(seeds=3)
    _, _, runs = bench.chosen_runs(args, "data", ["dense", "sparse25_small"], [1.0])
    figures = bench.compare(runs)
    dense, sparse = figures["dense"], figures["sparse25_small"]
    assert dense["accuracy_equal_seconds"] == pytest.approx(0.301)  # median of seeds 0, 1, 2
    assert (dense["equal_steps"], sparse["equal_steps"]) == (6, 4)  # sparse stopped at step 4
    assert sparse["accuracy_equal_steps"] == pytest.approx(0.311)
    assert sparse["dense_accuracy_equal_steps"] == pytest.approx(0.301 - 0.05)
    assert sparse["seeds"] == 3 and sparse["steps"] == 4 and sparse["parameters"] == 100


def test_runs_that_share_no_evaluated_step_are_an_error(bench):
    never = {"curve": {"step": [3]}}
    with pytest.raises(SystemExit, match="No step was evaluated by every run"):
        bench.last_common_step([never, {"curve": {"step": [2, 4]}}])
