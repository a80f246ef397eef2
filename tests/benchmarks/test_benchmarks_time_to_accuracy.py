"""The time-to-accuracy benchmark's bookkeeping: the grid, the first evaluation at the target,
the choice of learning rate, and a result in which a missed target stays visible; no training."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("studies.time_to_accuracy")


def test_grid_and_first_evaluation_at_the_target(bench):
    assert bench.learning_rate_grid(2e-3, 3) == pytest.approx([1e-3, 2e-3, 4e-3])
    assert bench.learning_rate_grid(2e-3, 1) == [2e-3]
    curve = {
        "step": [100, 200, 300],
        "train_seconds": [20.0, 41.0, 60.0],
        "sequences_seen": [1600, 3200, 4800],
        "masked_lm_accuracy": [0.2, 0.26, 0.24],
    }
    assert bench.time_to_target(curve, 0.25) == {"seconds": 41.0, "steps": 200, "sequences": 3200}
    assert bench.time_to_target(curve, 0.3) is None


def test_the_fastest_rate_wins_and_a_missed_target_is_not_hidden(bench):
    trials = {
        1e-3: {"to_target": {"seconds": 90.0}, "final_accuracy": 0.26},
        2e-3: {"to_target": {"seconds": 60.0}, "final_accuracy": 0.25},
        4e-3: {"to_target": None, "final_accuracy": 0.2},
    }
    assert bench.best_learning_rate(trials) == 2e-3
    missed = {lr: {**t, "to_target": None} for lr, t in trials.items()}
    assert bench.best_learning_rate(missed) == 1e-3  # none reached: the highest accuracy

    args = bench.parse_args(["--seeds=2", "--rows=padded+lamb,packed+soap", "--target=0.25"])
    reach = lambda s: {"to_target": {"seconds": s, "steps": s, "sequences": 16 * s}}
    trials = {
        "padded+lamb": {
            (1e-2, 0): reach(300.0) | {"compile_seconds": 5.0},
            (1e-2, 1): reach(340.0) | {"compile_seconds": 7.0},
        },
        "packed+soap": {
            (2e-3, 0): reach(100.0) | {"compile_seconds": 9.0},
            (2e-3, 1): {"to_target": None, "compile_seconds": 11.0},
        },
    }
    chosen = {"padded+lamb": 1e-2, "packed+soap": 2e-3}
    result = bench.summarize(args, trials, chosen, packing_factor=2.4, baseline=0.07)
    assert result["seconds_to_target"] == {"padded+lamb": 320.0, "packed+soap": None}
    assert result["speedup_vs_padded_lamb"] == {"padded+lamb": 1.0, "packed+soap": None}
    assert result["sequences_to_target"]["padded+lamb"] == 16 * 320.0
    assert result["compile_seconds"] == {"padded+lamb": 6.0, "packed+soap": 10.0}  # apart


def test_bad_arguments_are_named(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--rows=packed+adam"])
    assert "unknown rows ['packed+adam']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--grid=2"])
    assert "must be odd" in capsys.readouterr().err


def test_soap_staleness_rows_are_asked_for_by_name(bench):
    assert bench.parse_args([]).rows == list(bench.ROWS)  # not run by default
    args = bench.parse_args(["--rows=packed+soap,packed+soap-sync,packed+soap-every100"])
    assert args.rows == ["packed+soap", "packed+soap-sync", "packed+soap-every100"]
    settings = {row: bench.ALL_ROWS[row] for row in args.rows}
    assert {optimizer for _, optimizer, _ in settings.values()} == {"soap"}
    assert settings["packed+soap-sync"][2] == {"asynchronous": False}
    assert settings["packed+soap-every100"][2]["preconditioning_compute_steps"] == 100


def test_the_race_pairs_the_best_of_each_kind_and_keeps_a_miss_visible(bench):
    result = {
        "steps_to_target": {"packed+lamb": 1000, "packed+muon": 800, "packed+soap": 600},
        "seconds_to_target": {"packed+lamb": 330.0, "packed+muon": 300.0, "packed+soap": 210.0},
    }
    race = bench.race(result)
    assert race["steps_second_over_first_order"] == pytest.approx(600 / 800)
    assert race["seconds_second_over_first_order"] == pytest.approx(210 / 300)
    assert race["by_steps"] == ["packed+muon", "packed+soap"]
    result["steps_to_target"]["packed+soap"] = None  # every second-order seed set missed
    assert bench.race(result)["steps_second_over_first_order"] is None


def reuse(bench, monkeypatch, final: dict | None) -> None:
    """`bench.run`'s reuse check answers `final` (its task is not made: there are no data)."""
    monkeypatch.setattr(bench, "PreTrainingTask", lambda config: None)
    monkeypatch.setattr(bench.finished, "reusable_run", lambda workdir, config, task: final)


def test_a_run_says_whether_it_was_reused(bench, monkeypatch):
    args = bench.parse_args(["--workdir=/bench"])
    curve = {"step": [1], "train_seconds": [1.0], "sequences_seen": [16.0], bench.METRIC: [0.3]}
    monkeypatch.setattr(bench, "learning_curve", lambda workdir, metric: curve)
    earlier = {
        "baseline": 0.07,
        "reused": True,
        "preempted": False,
    }  # as `finished.reusable_run` returns it
    reuse(bench, monkeypatch, earlier)
    reused = bench.run(args, "data", "packed+lamb", 1e-2, 0)
    assert reused["reused"] and reused["workdir"] == "/bench/packed+lamb/lr1.00e-02_seed0"
    reuse(bench, monkeypatch, None)
    trained = {"baseline": 0.07, "preempted": False}
    monkeypatch.setattr(bench.loop, "train_and_evaluate", lambda config, workdir: trained)
    assert not bench.run(args, "data", "packed+lamb", 1e-2, 0)["reused"]


def test_a_preempted_run_stops_the_benchmark(bench, monkeypatch):
    """SIGTERM ends the run it hits as preempted; the benchmark must stop, not go on to the next."""
    args = bench.parse_args(["--workdir=/bench"])
    reuse(bench, monkeypatch, None)
    stopped = {"baseline": 0.07, "preempted": True, "step": 3}
    monkeypatch.setattr(bench.loop, "train_and_evaluate", lambda config, workdir: stopped)

    def exit_now(status):
        raise SystemExit(status)

    monkeypatch.setattr(bench.loop.os, "_exit", exit_now)
    with pytest.raises(SystemExit):
        bench.run(args, "data", "packed+lamb", 1e-2, 0)


def test_given_learning_rates_replace_a_rows_grid(bench):
    args = bench.parse_args(
        ["--rows=padded+lamb,packed+soap", "--grid=3", "--learning_rates=packed+soap=2e-3"]
    )
    grids = bench.row_grids(args)
    assert grids["packed+soap"] == [2e-3] and len(grids["padded+lamb"]) == 3
    for wrong in ("packed+muon=1e-2", "packed+soap", "packed+soap=1=2"):  # a row not run, no rate
        with pytest.raises(SystemExit):
            bench.parse_args(["--rows=padded+lamb,packed+soap", f"--learning_rates={wrong}"])


def test_config_flag_sets_the_recipe_every_row_trains(bench, capsys):
    args = bench.parse_args(["--rows=packed+lamb,packed+soap"])
    assert bench.row_config(args, "/data", "packed+soap", 1e-3, 0).model.preset == "tiny"  # CPU
    args = bench.parse_args(
        ["--config=configs/bert_base_lamb.py:phase2", "--data_dir=/data", "--rows=packed+soap"]
    )
    config = bench.row_config(args, args.data_dir, "packed+soap", 1e-3, seed=1)
    assert (config.model.preset, config.data.max_seq_length, config.model.scan_layers) == (
        "base", 512, False,
    )  # fmt: skip
    assert (config.optimizer.name, config.optimizer.soap.asynchronous) == ("soap", True)
    assert (config.data.data_dir, config.seed, config.schedule.learning_rate) == ("/data", 1, 1e-3)
    with pytest.raises(SystemExit):
        bench.parse_args(["--config=configs/bert_base_lamb.py:phase1"])
    assert "--config and --data_dir go together" in capsys.readouterr().err
