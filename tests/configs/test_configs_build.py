"""Every config in configs/ builds: its model, its optimizer, and it passes validation."""

from __future__ import annotations

import importlib
import math
import pkgutil

import jax.numpy as jnp
import optax
import pytest

import configs
import optim
from bert_flax.model.config import from_config_section
from bert_flax.train.setup import adjust_for_packing, validate_config
from configs import bert_base_long

# Configs whose get_config takes a phase.
PHASED = {
    "bert_base", "bert_base_padded", "bert_base_lamb", "bert_base_shampoo", "bert_base_soap",
    "bert_large", "bert_large_padded",
}  # fmt: skip
LONG = {"bert_base_long": bert_base_long.LENGTHS}  # configs whose get_config takes a row length
CASES = [
    (module.name, phase)
    for module in pkgutil.iter_modules(configs.__path__)
    for phase in LONG.get(module.name, ("phase1", "phase2") if module.name in PHASED else (None,))
]


def test_every_config_file_is_covered():
    assert {"tiny", "tiny_shampoo", "bert_base_shampoo", "finetune_sentiment"} <= {
        name for name, _ in CASES
    }


@pytest.mark.parametrize(("name", "phase"), CASES)
def test_config_builds_model_and_optimizer(name, phase):
    module = importlib.import_module(f"configs.{name}")
    config = module.get_config(phase) if phase else module.get_config()
    if config.task == "pretraining":  # (fine-tuning reads labelled files instead)
        config.data.synthetic = not config.data.data_dir
    validate_config(config)
    model = from_config_section(config.model, dtype=config.train.dtype)
    assert model.num_layers >= 1
    tx = optim.create(config.optimizer, learning_rate=optax.constant_schedule(1e-3))
    params = {"kernel": jnp.ones((8, 8))}
    updates, _ = tx.update(params, tx.init(params), params)
    assert updates["kernel"].shape == (8, 8)
    adjust_for_packing(config, 1.5)


@pytest.mark.parametrize("length", LONG["bert_base_long"])
def test_the_long_configs_hold_their_rows_positions_and_documents(length):
    config = bert_base_long.get_config(length)
    model = from_config_section(config.model)
    assert config.data.max_seq_length == model.max_position_embeddings == int(length)
    assert config.data.max_predictions_per_seq == math.ceil(0.15 * int(length))
    assert (config.data.algorithm, config.data.max_sequences_per_pack) == (
        "lpfhp",
        int(length) // 128,
    )


@pytest.mark.parametrize("name", ["bert_base", "bert_large"])
def test_the_presets_use_the_platforms_flash_kernel_at_512_and_dense_below(name):
    module = importlib.import_module(f"configs.{name}")
    phase1, phase2 = module.get_config("phase1").model, module.get_config("phase2").model
    assert (phase2.attention_impl, phase2.attention_dropout_rate) == ("auto", 0.0)
    assert phase1.attention_impl is None  # the preset's: XLA attention, with its dropout
    for phase in (phase1, phase2):  # unrolled, nothing recomputed: the best predicted step
        assert (phase.scan_layers, phase.remat_policy) == (False, "none")


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("phase", ["phase1", "phase2"])
@pytest.mark.parametrize("name", ["bert_base_shampoo", "bert_base_soap"])
def test_base_optimizer_recipes_differ_from_lambs_only_in_the_optimizer(name, phase):
    from configs import bert_base_lamb

    lamb = bert_base_lamb.get_config(phase)
    other = importlib.import_module(f"configs.{name}").get_config(phase)
    a, b = flat(lamb.to_dict()), flat(other.to_dict())
    assert a.keys() == b.keys()
    differ = {key for key in a if a[key] != b[key]}
    # The optimizer's block, and its learning rate (Adam's, not LAMB's: the configs say why).
    optimizer = {"optimizer.name", "schedule.learning_rate"}
    optimizer |= {key for key in a if key.startswith(f"optimizer.{other.optimizer.name}.")}
    assert differ <= optimizer and "optimizer.name" in differ


GLUE_METRICS = {
    "cola": "mcc", "sst2": "accuracy", "mrpc": "f1,accuracy", "stsb": "pearson,spearman",
    "qqp": "f1,accuracy", "mnli": "accuracy", "qnli": "accuracy", "rte": "accuracy",
    "wnli": "accuracy",
}  # fmt: skip


@pytest.mark.parametrize("task", sorted(GLUE_METRICS))
def test_glue_configs_judge_by_the_official_metrics(task):
    from configs import glue

    for arg in (task, f"{task},base"):
        config = glue.get_config(arg)
        validate_config(config)
        assert (config.task, config.glue.task, config.eval.metrics) == (
            "glue",
            task,
            GLUE_METRICS[task],
        )
        assert config.data.max_seq_length == 128 and config.train.epochs == 3.0
    assert config.model.preset == "base"
    matched = "validation_matched,validation_mismatched"
    assert config.eval.split == (matched if task == "mnli" else "validation")
    with pytest.raises(ValueError, match="Unknown GLUE task 'ax'"):
        glue.get_config("ax")
