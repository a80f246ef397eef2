"""config.json records what the run resolved: the block-sparse layers' implementation and the
attention backend, which training also logs once, and the run's length derived from its data,
apart from the config."""

from __future__ import annotations

import json
import logging

import pytest

from bert_flax.block_sparse import matmul
from bert_flax.kernels import block_sparse_cpu as cpu
from bert_flax.model import attention
from bert_flax.runs import metrics
from bert_flax.train import loop
from bert_flax.train.setup import create_train_setup

NO_COMPILER = "No C++ compiler found: cannot run 'c++' ($CXX)"


@pytest.mark.parametrize(
    ("sparse", "build_error", "impl"),
    [(False, None, None), (True, None, "cpu"), (True, NO_COMPILER, "xla")],
    ids=["dense", "cpu kernel", "no compiler"],
)
def test_config_json_names_the_block_sparse_impl(
    make_config, tmp_path, monkeypatch, caplog, sparse, build_error, impl
):
    if build_error is not None:
        monkeypatch.setattr(cpu, "build_error", lambda: build_error)
    matmul._log_impl.cache_clear()
    config = make_config()
    config.model.block_sparse.update(enabled=sparse, block_size=16, density=0.5)
    with caplog.at_level(logging.INFO):
        setup = create_train_setup(config)
        writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
        loop.write_run_config(config, setup, str(tmp_path), writer)
    resolved = json.loads((tmp_path / "config.json").read_text())["resolved"]
    assert resolved.get("block_sparse_impl") == impl
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Block-sparse")]
    if impl == "cpu":
        assert logged == ["Block-sparse layers use the 'cpu' implementation."]
    elif impl == "xla":
        assert len(logged) == 1 and logged[0].endswith(f"unavailable: {NO_COMPILER}")
    else:
        assert logged == []


@pytest.mark.parametrize(("impl", "resolved_impl"), [("auto", "xla"), ("cudnn", "cudnn")])
def test_config_json_names_the_attention_backend(
    make_config, tmp_path, caplog, impl, resolved_impl
):
    """'auto' resolved on this CPU (XLA attention), logged once; the config keeps 'auto', so
    the run's model resolves again wherever it is loaded."""
    attention._log_once.cache_clear()
    config = make_config()
    config.model.update(attention_impl=impl, attention_dropout_rate=0.0)
    with caplog.at_level(logging.INFO):
        setup = create_train_setup(config)
        writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
        loop.write_run_config(config, setup, str(tmp_path), writer)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["resolved"]["attention_impl"] == resolved_impl
    assert saved["model"]["attention_impl"] == impl
    logged = [r.getMessage() for r in caplog.records if "attention_impl='auto'" in r.getMessage()]
    assert logged == (["attention_impl='auto' on cpu: 'xla'."] if impl == "auto" else [])


def test_a_fine_tuning_run_derives_its_length_without_writing_the_config(tmp_path):
    """Steps from epochs, warm-up from a fraction and the evaluation interval are the run's
    (config.json's "resolved"), not the config's: the config is unchanged after the run,
    config.json keeps its fields as given, and a rerun (a resume) derives the same."""
    from configs import finetune_sentiment

    config = finetune_sentiment.get_config()
    config.model.num_layers, config.model.max_position_embeddings = 1, 64
    config.data.max_seq_length, config.data.train_examples = 32, 200
    config.train.epochs, config.train.min_steps, config.eval.evaluations = 1.0, 12, 3
    config.log.plots = False
    given = config.copy_and_resolve_references()
    workdir = tmp_path / "run"
    final = loop.train_and_evaluate(config, str(workdir))
    assert config == given  # deep equality, every field
    saved = json.loads((workdir / "config.json").read_text())
    resolved = saved.pop("resolved")
    assert (saved["train"]["steps"], saved["schedule"]["warmup_steps"]) == (
        given.train.steps,
        given.schedule.warmup_steps,
    )
    assert saved["eval"]["every_steps"] == given.eval.every_steps
    assert resolved["steps"] == final["step"] == 12  # min_steps: one epoch is fewer
    assert resolved["warmup_steps"] == 1  # round(0.1 * 12)
    assert resolved["eval_every_steps"] == resolved["checkpoint_every_steps"] == 4  # 12 / 3
    assert 0 < resolved["steps_per_epoch"] < 12
    evaluations = [r["step"] for r in metrics.read_metrics(str(workdir))["eval"]]
    assert evaluations == [4, 8, 12]
    again = loop.train_and_evaluate(config, str(workdir))  # resumes at its last step
    assert (again["step"], again["steps_this_run"]) == (12, 0)
    assert json.loads((workdir / "config.json").read_text())["resolved"] == resolved
