"""The `Task` interface: what a training run does with its data (the model, its objective, its
batches and how to judge an evaluation), and `model_config_from`, which every task uses."""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import ml_collections
import numpy as np

from bert_flax.model import losses
from bert_flax.model.config import INIT_FROM_PRESET, BertConfig, from_config_section
from bert_flax.runs import pretrained

Batch = dict[str, np.ndarray]


class Task(abc.ABC):
    """The task-specific half of a training run. Batches are this process's rows, as numpy."""

    name: str  # its key in `bert_flax.tasks.TASKS` (and `config.task`)

    # The evaluation metric that judges a run (logged first, and what "best" means) and the
    # others the evaluation line shows.
    eval_metric: str
    eval_metric_mode: str = "max"  # "max": higher is better; "min": lower
    eval_metrics_shown: tuple[str, ...] = ()
    # The training metrics the progress line shows.
    train_metrics_shown: tuple[str, ...] = ()

    def __init__(self, config: ml_collections.ConfigDict):
        self.config = config

    @property
    @abc.abstractmethod
    def objective(self) -> losses.Objective: ...

    @abc.abstractmethod
    def model(self, model_config: BertConfig) -> nn.Module: ...

    @abc.abstractmethod
    def model_config(self) -> BertConfig:
        """The model config: the preset with what `config.model` sets, checked against the data."""

    @abc.abstractmethod
    def packing_factor(self) -> float:
        """Mean sequences per training row (1 when padded)."""

    def steps_per_epoch(self, global_rows: int) -> int | None:
        """Steps of `global_rows` rows in one pass over the training data (`train.epochs`);
        None: the data is not read in epochs (its run length is `train.steps`)."""
        return None

    @abc.abstractmethod
    def synthetic_batch(self, rows: int, seed: int) -> Batch:
        """Random rows of this task's batch shape (initialisation, benchmarks, profiling)."""

    @abc.abstractmethod
    def train_batches(self, rows: int, vocab_size: int, *, start: int = 0) -> Iterator[Batch]:
        """Endless training batches of `rows` global rows from position `start` (batches)."""

    @abc.abstractmethod
    def eval_batches(self, rows: int, vocab_size: int) -> list[Batch]:
        """The fixed evaluation set."""

    @abc.abstractmethod
    def baseline(self, eval_set: list[Batch]) -> tuple[str, float]:
        """(description, value of `eval_metric`) of a trivial predictor on `eval_set`."""

    @abc.abstractmethod
    def identity(self) -> str:
        """What a checkpoint remembers of the data: a different one on resume is a new phase."""

    @abc.abstractmethod
    def check_batch(self, batch: Batch, model_config: BertConfig, *, evaluation: bool) -> None:
        """Host-side check of a first train or eval batch (raises ValueError naming what is
        wrong)."""

    def score_outputs(self, outputs: list[dict[str, np.ndarray]]) -> dict[str, float]:
        """Metrics from the model's outputs over the whole evaluation set (one dict per eval
        batch, global rows: what `objective.eval_outputs` returns), added to the summed ones.
        Only objectives with `eval_outputs` are called; e.g. SQuAD's exact match and F1."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {}

    def pretrained_params(self, pretraining_params: Any, params: Any) -> Any:
        """The model's parameters `params` initialised from `BertForPreTraining` parameters
        (`config.init_from`); pre-training takes them whole."""
        return pretraining_params

    def head_config(self) -> dict[str, Any]:
        """What a saved model needs besides its `BertConfig` and task name (`best.json`'s
        "task"), e.g. the label names."""
        return {}

    def plot(self, workdir: str) -> list[str]:
        """PNG plots of a finished run's metrics; returns their paths."""
        return []

    def predict_test(self, workdir: str) -> dict[str, Any]:
        """After training (process 0): what the best parameters predict of the task's test
        split(s), written to `workdir`, for the run's result ({}: nothing to predict)."""
        return {}

    @staticmethod
    def predict_file(workdir: str, path: str, output: str | None, **options: Any) -> str:
        """`bert_flax.train --predict`: the run's best parameters over the file `path`, written to
        `output` (None: the task's default); returns a one-line summary."""
        raise NotImplementedError("This task has no prediction command.")


def data_identity(task: str, summary: dict[str, Any], *, lowercase: bool = True) -> str:
    """`Task.identity` of a task's data `summary` (JSON) tokenized with or without lower-casing:
    its name and a digest (uncased runs keep the identity they had before the setting)."""
    if not lowercase:
        summary = {**summary, "cased": True}
    digest = hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()
    return f"{task}:{digest[:16]}"


def model_config_from(
    config: ml_collections.ConfigDict,
    max_seq_length: int,
    data_vocab_size: int | None = None,
    data_source: str | None = None,
) -> BertConfig:
    """The preset (or `config.init_from`'s model: `INIT_FROM_PRESET`) with the fields
    `config.model` sets, the compute dtype, and (unless set, or the checkpoint's) the vocabulary
    size of the data (`data_source`); checked against the data and the row length."""
    init_from = None
    if config.model.preset == INIT_FROM_PRESET and config.init_from:
        init_from = pretrained.pretrained_config(config.init_from)
    fields = {"dtype": config.train.dtype}
    if data_vocab_size is not None and config.model.vocab_size is None and not init_from:
        fields["vocab_size"] = data_vocab_size
    model_config = from_config_section(config.model, init_from, **fields)
    if data_vocab_size is not None and model_config.vocab_size < data_vocab_size:
        fix = (
            "Use the vocabulary it was pre-trained with"
            if init_from
            else "Leave config.model.vocab_size unset or raise it"
        )
        raise ValueError(
            f"The model's vocab_size={model_config.vocab_size} is smaller than the "
            f"vocabulary of {data_source} ({data_vocab_size} ids): out-of-range ids "
            f"would embed as NaN. {fix}."
        )
    if max_seq_length > model_config.max_position_embeddings:
        fix = (
            "config.init_from's table is fixed: lower config.data.max_seq_length"
            if init_from
            else f"set config.model.max_position_embeddings={max_seq_length} (or more), as "
            "configs/bert_base_long.py does"
        )
        raise ValueError(
            f"config.data.max_seq_length={max_seq_length} is longer than the position table "
            f"(config.model.max_position_embeddings={model_config.max_position_embeddings}): "
            f"{fix}."
        )
    return model_config
