"""Google BERT TensorFlow checkpoints (`bert_config.json` + `bert_model.ckpt.*`) -> bert_flax
parameters, through the name table (`tables.py`).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_flax.convert.hugging_face import config_from_hf
from bert_flax.convert.tables import (
    Params,
    check_has_layout,
    check_shape,
    expected_shapes,
    param_table,
    unflatten,
)
from bert_flax.model.bert import stack_layers
from bert_flax.model.config import BertConfig

# The Google BERT code's "gelu" is the tanh approximation.
_TF_ACTS = {"gelu": "gelu_tanh", "relu": "relu"}


# ---------------------------------------------------------------------------------------------
# Google BERT TensorFlow checkpoints.

_TF_IGNORED_SUFFIXES = ("/adam_m", "/adam_v", "global_step", "/Adam", "/Adam_1")


def config_from_tf(tf_config: Mapping[str, Any], **overrides: Any) -> BertConfig:
    """BertConfig from a Google BERT `bert_config.json` dict (LayerNorm eps is 1e-12 there)."""
    act = tf_config.get("hidden_act", "gelu")
    if act not in _TF_ACTS:
        raise ValueError(f"hidden_act={act!r} is not supported; known: {sorted(_TF_ACTS)}.")
    hf_like = {**tf_config, "hidden_act": "gelu"}
    return config_from_hf(hf_like, hidden_act=_TF_ACTS[act], layer_norm_eps=1e-12, **overrides)


def from_tf_variables(variables: Mapping[str, np.ndarray], config: BertConfig) -> Params:
    """Google BERT variables (name -> array, as in `tf.train.load_checkpoint`) -> our params.

    Optimizer slots (adam_m, adam_v) and global_step are skipped; any other unknown variable is
    an error.
    """
    check_has_layout(config)
    if config.scan_layers:
        return stack_layers(from_tf_variables(variables, config.replace(scan_layers=False)))
    expected = expected_shapes(config)
    flat, used = {}, set()
    for p in param_table(config):
        if p.tf not in variables:
            raise KeyError(f"TF checkpoint lacks {p.tf!r} (needed for {p.ours}).")
        value = np.asarray(variables[p.tf], dtype=np.float32)
        value = value.T if p.tf_transposed else value
        check_shape(p.tf, value, expected[p.ours])
        flat[p.ours] = np.ascontiguousarray(value)
        used.add(p.tf)
    unknown = {
        name for name in variables if name not in used and not name.endswith(_TF_IGNORED_SUFFIXES)
    }
    if unknown:
        raise ValueError(f"Unexpected TF variables (not converted): {sorted(unknown)}.")
    return unflatten(flat)


def _tf_checkpoint_prefix(path: str) -> str:
    import tensorflow as tf

    if os.path.isdir(path):
        prefix = tf.train.latest_checkpoint(path)
        if prefix is None:
            candidates = glob.glob(os.path.join(path, "*.index"))
            if len(candidates) != 1:
                raise FileNotFoundError(
                    f"Expected one TF checkpoint (*.index) in {path!r}, found {candidates}."
                )
            prefix = candidates[0][: -len(".index")]
        return prefix
    return path


def read_tf_config(
    path: str, config_path: str | None = None, **config_overrides: Any
) -> BertConfig:
    """The BertConfig of a Google BERT checkpoint (directory or prefix): `config_path`, default
    the bert_config.json beside it."""
    if config_path is None:
        config_path = os.path.join(os.path.dirname(_tf_checkpoint_prefix(path)), "bert_config.json")
    with open(config_path) as f:
        return config_from_tf(json.load(f), **config_overrides)


def load_tf_checkpoint(
    path: str, config_path: str | None = None, **config_overrides: Any
) -> tuple[BertConfig, Params]:
    """Reads a Google BERT checkpoint (directory or prefix) and its bert_config.json."""
    import tensorflow as tf

    config = read_tf_config(path, config_path, **config_overrides)
    reader = tf.train.load_checkpoint(_tf_checkpoint_prefix(path))
    names = reader.get_variable_to_shape_map()
    variables = {name: reader.get_tensor(name) for name in names}
    return config, from_tf_variables(variables, config)
