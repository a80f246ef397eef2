"""Tasks: what a training run does with its data. One train loop, setup, train step, optimizer
stack, mesh and checkpointing serve them all (`bert_flax.train`); a task contributes the model,
its objective, its batches and how to judge an evaluation.

    task = PreTrainingTask(config)                 # bert_flax.main
    task = finetune.ClassificationTask(config)     # bert_flax.finetune
    final = train.train_and_evaluate(config, workdir, task=task)

A new task subclasses `Task` (see `bert_flax.finetune.ClassificationTask` for a second example).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import ml_collections
import numpy as np

from bert_flax import input_pipeline, losses
from bert_flax.config import BertConfig, from_config_section
from bert_flax.data import synthetic
from bert_flax.data.contract import PreparedData, RowShape, check_batch
from bert_flax.model import BertForPreTraining

Batch = dict[str, np.ndarray]
# The masking rate of synthetic batches (prepared data state their own).
SYNTHETIC_MASKED_LM_PROB = 0.15


class Task(abc.ABC):
    """The task-specific half of a training run. Batches are this process's rows, as numpy."""

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

    def describe(self) -> dict[str, Any]:
        return {}

    def pretrained_params(self, pretraining_params: Any, params: Any) -> Any:
        """The model's parameters `params` initialised from `BertForPreTraining` parameters
        (`config.init_from`); pre-training takes them whole."""
        return pretraining_params

    def head_config(self) -> dict[str, Any]:
        """What a saved model needs besides its `BertConfig` (e.g. the label names)."""
        return {}

    def plot(self, workdir: str) -> list[str]:
        """PNG plots of a finished run's metrics; returns their paths."""
        return []


class PreTrainingTask(Task):
    """Masked-LM + NSP pre-training on prepared data (`create_pretraining_data`) or random rows."""

    eval_metric = "masked_lm_accuracy"
    eval_metrics_shown = ("mlm_loss", "nsp_accuracy")
    train_metrics_shown = ("mlm_loss", "mlm_accuracy")

    def __init__(self, config: ml_collections.ConfigDict):
        super().__init__(config)
        self.data = None if config.data.synthetic else prepared_data(config)
        self.row_shape = row_shape_of(config, self.data)
        self.eval_row_shape = row_shape_of(
            config, self.data, packed=input_pipeline.eval_packed(config)
        )

    @property
    def objective(self) -> losses.Objective:
        return losses.pretraining_objective(self.config.train.mlm_normalization)

    def model(self, model_config: BertConfig) -> nn.Module:
        return BertForPreTraining(model_config)

    def model_config(self) -> BertConfig:
        vocab_size = None if self.data is None else self.data.vocab_size
        source = None if self.data is None else self.data.data_dir
        return model_config_from(self.config, self.row_shape.max_seq_length, vocab_size, source)

    def packing_factor(self) -> float:
        config = self.config
        if not config.data.packed:
            return 1.0
        if self.data is not None:
            depth, algorithm = config.data.max_sequences_per_pack, config.data.algorithm
            return self.data.packing_factor(depth, algorithm)
        rows = synthetic.random_row_lengths(
            256, config.data.max_seq_length, config.data.max_sequences_per_pack, seed=config.seed
        )
        return float(np.mean([len(r) for r in rows]))

    def synthetic_batch(self, rows: int, seed: int) -> Batch:
        vocab_size = self.model_config().vocab_size
        return synthetic.random_batch(rows, self.row_shape, vocab_size=vocab_size, seed=seed)

    def train_batches(self, rows: int, vocab_size: int, *, start: int = 0) -> Iterator[Batch]:
        return input_pipeline.train_iterator(
            self.config, rows, self.row_shape, vocab_size, start=start
        )

    def eval_batches(self, rows: int, vocab_size: int) -> list[Batch]:
        return input_pipeline.eval_batches(self.config, rows, self.eval_row_shape, vocab_size)

    def baseline(self, eval_set: list[Batch]) -> tuple[str, float]:
        token, accuracy = input_pipeline.most_frequent_token_accuracy(eval_set)
        return f"always predicting token {token}", accuracy

    def identity(self) -> str:
        if self.data is not None:
            return self.data.fingerprint
        return f"synthetic:{self.row_shape.max_seq_length}"

    def check_batch(self, batch: Batch, model_config: BertConfig, *, evaluation: bool) -> None:
        check_batch(batch, model_config, self.eval_row_shape if evaluation else self.row_shape)

    def plot(self, workdir: str) -> list[str]:
        from bert_flax import plots

        return plots.plot_run(workdir, None if self.data is None else self.data.data_dir)

    def describe(self) -> dict[str, Any]:
        return {
            "max_seq_length": self.row_shape.max_seq_length,
            "max_sequences_per_row": self.row_shape.max_sequences_per_pack,
            "max_predictions_per_row": self.row_shape.max_predictions_per_pack,
        }


def prepared_data(config: ml_collections.ConfigDict) -> PreparedData:
    """`config.data.data_dir`, checked against the config."""
    if not config.data.data_dir:
        raise ValueError(
            "config.data.data_dir is empty: prepare data with `python -m "
            "bert_flax.data.create_pretraining_data --output_dir=DIR ...` and pass "
            "--config.data.data_dir=DIR (or --config.data.synthetic=True for random batches)."
        )
    data = PreparedData.load(config.data.data_dir)
    if data.max_seq_length != config.data.max_seq_length:
        raise ValueError(
            f"config.data.max_seq_length={config.data.max_seq_length} but "
            f"{config.data.data_dir} was prepared with max_seq_length={data.max_seq_length}."
        )
    return data


def row_shape_of(
    config: ml_collections.ConfigDict, data: PreparedData | None, *, packed: bool | None = None
) -> RowShape:
    """The batches' row shape (`packed`: default `config.data.packed`): from the prepared data,
    or for synthetic batches from the config (the same bound on masked positions either way)."""
    depth = config.data.max_sequences_per_pack
    packed = config.data.packed if packed is None else packed
    if data is not None:
        return data.row_shape(depth, packed=packed)
    return RowShape.bounded(
        config.data.max_seq_length,
        depth,
        masked_lm_prob=SYNTHETIC_MASKED_LM_PROB,
        max_predictions_per_seq=config.data.max_predictions_per_seq,
        packed=packed,
    )


def model_config_from(
    config: ml_collections.ConfigDict,
    max_seq_length: int,
    data_vocab_size: int | None = None,
    data_source: str | None = None,
) -> BertConfig:
    """The preset with the fields `config.model` sets, the compute dtype, and (unless set) the
    vocabulary size of the data (`data_source`); checked against the data and the row length."""
    fields = {"dtype": config.train.dtype}
    if data_vocab_size is not None and config.model.get("vocab_size") is None:
        fields["vocab_size"] = data_vocab_size
    model_config = from_config_section(config.model, **fields)
    if data_vocab_size is not None and model_config.vocab_size < data_vocab_size:
        raise ValueError(
            f"The model's vocab_size={model_config.vocab_size} is smaller than the "
            f"vocabulary of {data_source} ({data_vocab_size} ids): out-of-range ids "
            "would embed as NaN. Leave config.model.vocab_size unset or raise it."
        )
    if max_seq_length > model_config.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={max_seq_length} exceeds the model's "
            f"max_position_embeddings={model_config.max_position_embeddings}."
        )
    return model_config
