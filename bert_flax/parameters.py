"""Parameters from anything, with shape checks: the one home of loading and saving parameters.

    config, params = load_pretrained("/ckpt/bert-base-uncased")   # what `config.init_from` reads
    config, params = load_pretrained("workdir/tiny", step=2000)    # a run's checkpoint
    save_params(params, config, "/ckpt/flax_tiny")                   # a bert_flax directory
    config, params, head = load_finetuned("workdir/sst")           # a fine-tuned model (best/)

What a path holds decides how it is read (`checkpoint_kind`): a `bert_flax.main` workdir (its
orbax checkpoints; only the parameters are restored, not the optimizer state), a bert_flax
directory (`params.msgpack` + `bert_config.json`, what `save_params` and a run's `best/` hold), a
Hugging Face directory or a Google BERT checkpoint (`bert_flax.convert`'s name tables).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping
from typing import Any

import flax.serialization
import flax.traverse_util
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from bert_flax import checkpointing, convert
from bert_flax.config import BertConfig
from bert_flax.data.contract import SUMMARY_FILE, PreparedData

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
    against `BertForPreTraining`'s shapes unless `pretraining=False` (a fine-tuned model)."""
    config = read_config(directory, **config_overrides)
    with open(os.path.join(directory, PARAMS_FILE), "rb") as f:
        params = flax.serialization.msgpack_restore(f.read())
    if pretraining:
        check_params_fit(params, convert.expected_shapes(config), directory)
    return config, params


# ---------------------------------------------------------------------------------------------
# Training runs.


def restore_params(workdir: str, step: int | None = None) -> tuple[int, Params]:
    """(step, parameters as numpy) of a run's checkpoint: `step`, or the newest that restores
    (one whose files show damage is reported and skipped, left in place: this is another run's
    workdir; any other failure is a CheckpointError). Only the parameters are read (orbax partial
    restore), onto one device whatever mesh wrote them."""
    directory = checkpointing.checkpoint_dir(workdir)
    # PyTreeCheckpointHandler reads what StandardCheckpointHandler wrote and restores subtrees.
    handlers = {**checkpointing.item_handlers(), "state": ocp.PyTreeCheckpointHandler()}
    manager = ocp.CheckpointManager(
        directory, item_names=checkpointing.ITEMS, item_handlers=handlers
    )
    try:
        steps = sorted(manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"{directory} holds no checkpoint (is {workdir} a run?).")
        if step is not None and step not in steps:
            raise ValueError(f"{directory} has no checkpoint of step {step}; it has {steps}.")
        damaged = []
        for candidate in [step] if step is not None else steps:
            try:
                return candidate, _read_params_only(manager, candidate)
            except Exception as error:  # orbax and tensorstore raise many kinds for bad files
                shown = checkpointing.damage(directory, candidate)
                if shown is None:
                    reason = f"{type(error).__name__}: {checkpointing.short_reason(error)}"
                    raise checkpointing.read_failed(directory, candidate, reason) from error
                damaged.append(f"step {candidate}: {shown}"[:400])
                logging.warning("Checkpoint %s of %s is damaged: %s", candidate, directory, shown)
        raise checkpointing.CheckpointError(
            f"No checkpoint in {directory} restores: {'; '.join(damaged)}"
        )
    finally:
        manager.close()


def _read_params_only(manager: ocp.CheckpointManager, step: int) -> Params:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    saved = manager.item_metadata(step)["state"].tree["params"]
    target = {
        "params": jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved)
    }
    restore_args = jax.tree_util.tree_map(lambda _: ocp.ArrayRestoreArgs(sharding=device), target)
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(target, restore_args=restore_args, partial_restore=True)
        ),
    )
    return jax.tree_util.tree_map(np.asarray, restored["state"]["params"])


def load_workdir(workdir: str, step: int | None = None) -> tuple[BertConfig, Params]:
    """A training run's parameters (checkpoint `step`, default the latest) and its BertConfig
    (the `bert_config.json` the run wrote)."""
    config = read_config(workdir)
    step, params = restore_params(workdir, step)
    logging.info("Read the parameters of step %d from %s", step, workdir)
    return config, params


# ---------------------------------------------------------------------------------------------
# Any of the above, by what a path holds.


def checkpoint_kind(path: str) -> str:
    """ "workdir", "bert_flax", "hf" or "tf": what `path` holds."""
    if os.path.isdir(checkpointing.checkpoint_dir(path)):
        return "workdir"
    if os.path.isfile(os.path.join(path, PARAMS_FILE)):
        return "bert_flax"
    if os.path.isfile(os.path.join(path, "config.json")):
        return "hf"
    if glob.glob(os.path.join(path, "*.index")) or glob.glob(path + ".index"):
        return "tf"
    raise FileNotFoundError(
        f"{path!r} is none of: a bert_flax.main workdir (checkpoints/), a bert_flax directory "
        f"({PARAMS_FILE}), a Hugging Face directory (config.json + weights), a Google BERT "
        "checkpoint (*.index + bert_config.json)."
    )


def pretrained_config(path: str) -> BertConfig:
    """The BertConfig of any checkpoint `checkpoint_kind` recognises, its parameters unread
    (what `config.model.preset="init_from"` builds on)."""
    kind = checkpoint_kind(path)
    if kind in ("workdir", "bert_flax"):
        return read_config(path)
    if kind == "hf":
        return convert.read_hf_config(path)
    return convert.read_tf_config(path)


def pretrained_vocab_file(path: str) -> str | None:
    """The WordPiece vocabulary the checkpoint at `path` was trained with, where it says: a
    run's prepared data's (its config.json's data_dir), else a vocab.txt beside the weights;
    None if neither."""
    run_config = os.path.join(path, "config.json")
    if checkpoint_kind(path) == "workdir" and os.path.isfile(run_config):
        with open(run_config) as f:
            data_dir = json.load(f).get("data", {}).get("data_dir") or ""
        if data_dir and os.path.isfile(os.path.join(data_dir, SUMMARY_FILE)):
            vocab = PreparedData.load(data_dir).vocab_file
            if vocab:
                return vocab
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    vocab = os.path.join(folder, "vocab.txt")
    return vocab if os.path.isfile(vocab) else None


def load_pretrained(path: str, step: int | None = None) -> tuple[BertConfig, Params]:
    """(BertConfig, params) from any checkpoint `checkpoint_kind` recognises; `step` picks a
    workdir's checkpoint (default the latest)."""
    kind = checkpoint_kind(path)
    if step is not None and kind != "workdir":
        raise ValueError(f"A step ({step}) selects a workdir's checkpoint; {path!r} is {kind}.")
    if kind == "workdir":
        return load_workdir(path, step)
    if kind == "bert_flax":
        return load_params(path)
    if kind == "hf":
        return convert.load_hf_checkpoint(path)
    return convert.load_tf_checkpoint(path)


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
