"""config.json records what the run resolved: the block-sparse layers' implementation and the
attention backend, which training also logs once."""

from __future__ import annotations

import json
import logging

import pytest

from bert_flax.block_sparse import cpu, matmul
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
