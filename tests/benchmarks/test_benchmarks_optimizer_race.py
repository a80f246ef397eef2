"""The optimizer race's recipe: configs/tiny.py, or --config's with --centres; no training."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("studies.optimizer_race")


def test_the_race_trains_the_config_it_is_given(bench, capsys):
    tiny = bench.race_config(bench.parse_args([]), "shampoo", 1e-3, 10, seed=0)
    assert (tiny.model.preset, tiny.optimizer.name) == ("tiny", "shampoo")
    args = bench.parse_args(
        ["--config=configs/bert_base_lamb.py:phase1", "--data_dir=/data", "--centres=adamw=1e-3"]
    )
    assert args.centres == bench.CENTRE_LEARNING_RATES | {"adamw": 1e-3}
    config = bench.race_config(args, "shampoo", 2e-3, 40, seed=2, block_size=64)
    assert (config.model.preset, config.model.scan_layers, config.data.data_dir) == (
        "base", False, "/data",
    )  # fmt: skip
    shampoo = config.optimizer.shampoo
    assert (config.optimizer.name, shampoo.asynchronous, shampoo.block_size) == (
        "shampoo", True, 64,
    )  # fmt: skip
    assert (config.schedule.learning_rate, config.schedule.warmup_steps, config.seed) == (
        2e-3, 40, 2,
    )  # fmt: skip
    assert config.train.steps == args.steps and config.train.batch_size == 65_536  # the config's
    with pytest.raises(SystemExit):
        bench.parse_args(["--centres=soap=1e-3"])
    assert "--centres=soap=1e-3: give NAME=RATE" in capsys.readouterr().err
