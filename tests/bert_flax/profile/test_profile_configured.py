"""The configured-step entry point: sweeps, config overrides and one profile of a micro BERT."""

import json

import pytest

from bert_flax.profile import configured, report
from bert_flax.profile.ceilings import Ceilings
from configs import tiny


def test_parse_sweeps_and_their_product():
    sweeps = configured.parse_sweeps(["seq_len=128,512", "dtype=float32,bfloat16"])
    assert sweeps == [("seq_len", ["128", "512"]), ("dtype", ["float32", "bfloat16"])]
    settings = configured.sweep_settings(sweeps)
    assert len(settings) == 4 and settings[1] == {"seq_len": "128", "dtype": "bfloat16"}
    assert configured.sweep_settings([]) == [{}]


@pytest.mark.parametrize("spec", ["seq_len", "=1,2", "seq_len="])
def test_bad_sweep_is_a_clear_error(spec):
    with pytest.raises(ValueError, match="key=v1,v2"):
        configured.parse_sweeps([spec])


def test_settings_are_typed_and_aliases_resolve():
    config = configured.with_settings(
        tiny.get_config(), {"seq_len": "512", "packed": "false", "layers": "1", "dtype": "bfloat16"}
    )
    assert config.data.max_seq_length == 512 and config.data.packed is False
    assert config.model.num_layers == 1 and config.train.dtype == "bfloat16"
    assert tiny.get_config().data.max_seq_length == 128  # the original is untouched


def test_unknown_setting_names_the_field():
    with pytest.raises(KeyError, match=r"data\.max_seq_len"):
        configured.with_settings(tiny.get_config(), {"data.max_seq_len": "1"})


@pytest.mark.slow
def test_profile_of_a_micro_bert_step(tmp_path):
    config = configured.with_settings(
        tiny.get_config(),
        {
            "layers": "1",
            "model.hidden_size": "32",
            "model.num_heads": "2",
            "model.intermediate_size": "64",
            "model.vocab_size": "1000",
            "seq_len": "32",
            "batch_size": "2",
            "data.max_predictions_per_seq": "5",
            "eval.batch_size": "1",
        },
    )
    fake = Ceilings(1e10, 1e9, "float32", 256, 2**26)
    p = configured.profile_config(config, steps=2, warmup=1, ceilings=fake, logdir=str(tmp_path))
    by_class = p.by_class()
    for name in (
        "mlm_head",
        "qkv_projection",
        "feed_forward",
        "attention_scores",
        "loss",
        "optimizer",
        "normalization",
        "embedding",
    ):
        assert name in by_class, name
    assert p.settings["seq_len"] == 32 and p.settings["optimizer"] == config.optimizer.name
    total = json.loads(report.json_lines(p)[-1])
    assert total["class"] == "total" and total["seq_len"] == 32
