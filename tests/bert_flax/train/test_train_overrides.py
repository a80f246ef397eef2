"""Command-line overrides: typed parsing, errors naming the valid keys, the model section."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bert_flax.model.config import (
    BertConfig,
    config_section,
    from_config_section,
    resolved_config_section,
)
from bert_flax.train import overrides
from configs import default


def test_values_parse_to_the_fields_type():
    config = default.get_config()
    overrides.set_value(config, "model.num_layers", "3")  # a placeholder of type int
    overrides.set_value(config, "data.packed", "false")
    overrides.set_value(config, "schedule.learning_rate", "2e-4")
    overrides.set_value(config, "mesh.shape", "(2, 1, 4)")
    overrides.set_value(config, "optimizer.shampoo.asynchronous", "true")
    assert config.model.num_layers == 3 and config.data.packed is False
    assert config.schedule.learning_rate == 2e-4 and config.mesh.shape == (2, 1, 4)
    assert config.optimizer.shampoo.asynchronous is True
    with pytest.raises(ValueError):
        overrides.set_value(config, "model.num_layers", "two")


def test_unknown_key_names_the_valid_ones():
    config = default.get_config()
    with pytest.raises(KeyError, match=r"config\.model has no field 'num_layer'.*'num_layers'"):
        overrides.check_key(config, "model.num_layer")
    with pytest.raises(KeyError, match=r"config\.optimizer has no field 'adam'.*'adamw'"):
        overrides.check_key(config, "optimizer.adam.b1")
    overrides.check_key(config, "model.block_sparse.density")


def test_override_keys_of_an_argv():
    argv = ["main", "--config=configs/tiny.py", "--config.model.num_layers=2", "--noconfig.x.y"]
    assert overrides.override_keys(argv) == ["model.num_layers", "x.y"]


def test_model_section_defaults_to_the_preset_and_takes_every_field():
    section = config_section("mini")
    assert from_config_section(section) == BertConfig.preset("mini")
    section.num_layers, section.attention_impl = 1, "cudnn"
    section.attention_dropout_rate = 0.0
    section.block_sparse.update(enabled=True, density=0.25)
    config = from_config_section(section, dtype="bfloat16")
    assert (config.num_layers, config.hidden_size, config.attention_impl) == (1, 256, "cudnn")
    assert config.block_sparse.density == 0.25 and config.dtype.name == "bfloat16"
    with section.unlocked():
        section.hidden = 3
    with pytest.raises(ValueError, match=r"unknown fields \['hidden'\]"):
        from_config_section(section)


def test_the_resolved_section_shows_every_value_and_builds_the_same_model():
    section = config_section("base")
    section.num_layers = 3
    section.block_sparse.update(enabled=True, density=0.25)
    model = from_config_section(section)
    shown = resolved_config_section(model, "base")
    assert shown.preset == "base" and shown.num_layers == 3 and shown.hidden_size == 768
    assert all(shown[k] is not None for k in shown)  # no placeholder left
    assert shown.block_sparse.enabled and shown.block_sparse.density == 0.25
    assert from_config_section(shown) == model


def test_the_command_line_rejects_an_unknown_key_in_one_line(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bert_flax.train",
            "--config=configs/tiny.py",
            f"--workdir={tmp_path}",
            "--config.model.num_layer=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "--config.model has no field 'num_layer'" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
