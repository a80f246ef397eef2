"""Parameters from anything, with shape checks: the one home of loading and saving parameters.

    config, params = load_pretrained("/ckpt/bert-base-uncased")   # what `config.init_from` reads
    config, params = load_pretrained("workdir/tiny", step=2000)    # a run's checkpoint
    save_params(params, config, "/ckpt/flax_tiny")                   # a bert_flax directory
    config, params, head = load_finetuned("workdir/sst")           # a fine-tuned model (best/)

What a path holds decides how it is read (`checkpoint_kind`): a `bert_flax.train` workdir (its
orbax checkpoints; only the parameters are restored, not the optimizer state), a bert_flax
directory (`params.msgpack` + `bert_config.json`, what `save_params` and a run's `best/` hold), a
Hugging Face directory or a Google BERT checkpoint (`bert_flax.convert`'s name tables).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import flax.serialization
import flax.traverse_util
import jax
import numpy as np
from absl import logging

from bert_flax.convert import hugging_face
from bert_flax.model.config import BertConfig

Params = dict[str, Any]

PARAMS_FILE = "params.msgpack"
CONFIG_FILE = "bert_config.json"
BEST_DIR, BEST_FILE = "best", "best.json"  # a run's best parameters (`BestParams`)


def flat_shapes(params: Params) -> dict[str, tuple[int, ...]]:
    """{"bert/layer_0/...": shape} of a parameter tree (of arrays, shape structs or orbax's
    array metadata)."""
    flat = flax.traverse_util.flatten_dict(params, sep="/")
    return {k: tuple(v.shape if hasattr(v, "shape") else np.shape(v)) for k, v in flat.items()}


def misfits(
    got: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]], source: str
) -> list[str]:
    """Every parameter (flat name -> shape) of `got` missing from, extra to, or shaped unlike
    `expected`, as "name: what is wrong"."""
    problems = [f"{k}: missing from {source}" for k in sorted(set(expected) - set(got))]
    problems += [f"{k}: in {source} but not in the model" for k in sorted(set(got) - set(expected))]
    problems += [
        f"{k}: {source} has shape {got[k]}, the model {tuple(expected[k])}"
        for k in sorted(set(got) & set(expected))
        if tuple(got[k]) != tuple(expected[k])
    ]
    return problems


def check_params_fit(params: Params, expected: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Raises ValueError naming every parameter of `params` missing from, extra to, or shaped
    unlike `expected` ({"bert/layer_0/...": shape})."""
    problems = misfits(flat_shapes(params), expected, source)
    if problems:
        raise ValueError(f"Parameters of {source} do not fit the model: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# bert_flax directories.


def save_params(params: Params, config: BertConfig, directory: str) -> None:
    """Writes `params.msgpack` (float32 numpy tree) and `bert_config.json` to `directory`."""
    os.makedirs(directory, exist_ok=True)
    host = jax.tree_util.tree_map(np.asarray, jax.device_get(params))
    with open(os.path.join(directory, PARAMS_FILE), "wb") as f:
        f.write(flax.serialization.msgpack_serialize(host))
    with open(os.path.join(directory, CONFIG_FILE), "w") as f:
        json.dump(config.to_dict(), f, indent=2)


def read_config(directory: str, **config_overrides: Any) -> BertConfig:
    """The BertConfig of a bert_flax directory or a training run (its `bert_config.json`)."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {directory!r} holds no bert_flax model.")
    with open(path) as f:
        return BertConfig.from_dict({**json.load(f), **config_overrides})


def load_params(
    directory: str, *, pretraining: bool = True, **config_overrides: Any
) -> tuple[BertConfig, Params]:
    """Reads what `save_params` wrote -> (BertConfig with overrides, params as numpy); checked
    against the shapes of the class they are (`BertForPreTraining`, an encoder, a converted
    task-headed model: `hugging_face.layout_shapes`) unless `pretraining=False` (a fine-tuned
    model of any task)."""
    config = read_config(directory, **config_overrides)
    with open(os.path.join(directory, PARAMS_FILE), "rb") as f:
        params = flax.serialization.msgpack_restore(f.read())
    if pretraining:
        check_params_fit(params, hugging_face.layout_shapes(params, config), directory)
    return config, params


# ---------------------------------------------------------------------------------------------
# A run's best parameters.


class BestParams:
    """With `config.checkpoint.keep_best`: the parameters of the best complete evaluation so far
    (by `task.eval_metric`, higher or lower as `task.eval_metric_mode` says) as a bert_flax
    directory `workdir/best`, with `best/best.json` (the step, the evaluation and the task's
    head config)."""

    def __init__(self, workdir: str, *, metric: str, mode: str, enabled: bool):
        self.directory = os.path.join(workdir, BEST_DIR)
        self.metric, self.mode, self.enabled = metric, mode, enabled
        self.record: dict[str, Any] = {}
        path = os.path.join(self.directory, BEST_FILE)
        if enabled and os.path.isfile(path):  # a resumed run competes with its earlier best
            with open(path) as f:
                self.record = json.load(f)

    def offer(
        self,
        step: int,
        summary: dict[str, float],
        params: Params,
        model_config: BertConfig,
        head_config: dict[str, Any],
    ) -> bool:
        """Saves `params` if `summary` beats the best so far; returns whether it did."""
        value = summary.get(self.metric)
        if not self.enabled or value is None or not np.isfinite(value):
            return False
        best = self.record.get("value")
        if best is not None and not (value > best if self.mode == "max" else value < best):
            return False
        save_params(params, model_config, self.directory)
        self.record = {"step": step, "metric": self.metric, "value": float(value)}
        self.record.update({"eval": summary, **head_config})
        with open(os.path.join(self.directory, BEST_FILE), "w") as f:
            json.dump(self.record, f, indent=2, default=float)
        logging.info("Best %s so far (%.4f): saved to %s", self.metric, value, self.directory)
        return True


def load_finetuned(directory: str) -> tuple[BertConfig, Params, dict[str, Any]]:
    """(model config, parameters, head config) of a fine-tuned model: `workdir/best` (or a
    workdir, whose `best` is used)."""
    best = os.path.join(directory, BEST_DIR)
    if os.path.isdir(best):
        directory = best
    path = os.path.join(directory, BEST_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} not found: {directory!r} holds no fine-tuned model; train one with "
            "`python -m bert_flax.finetune --config=configs/finetune_sentiment.py --workdir=DIR` "
            "(or configs/squad.py)."
        )
    with open(path) as f:
        head = json.load(f)
    model_config, params = load_params(directory, pretraining=False)
    return model_config, params, head
