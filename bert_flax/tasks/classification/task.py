"""Fine-tuning: `BertForSequenceClassification` (classification or regression) on packed rows of
labelled text (`data.py`, read by `reading.py`), one epoch of batches at a time."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import ml_collections
import numpy as np
from absl import logging

from bert_flax.input_pipeline import contract
from bert_flax.model import losses
from bert_flax.model.config import BertConfig
from bert_flax.tasks.base import Batch, data_identity, model_config_from
from bert_flax.tasks.classification import data as classification
from bert_flax.tasks.classification import metrics, predict, reading
from bert_flax.tasks.classification.model import (
    CLASSIFICATION,
    BertForSequenceClassification,
    classifier_start,
)
from bert_flax.tasks.finetuning import FineTuningTask, task_vocab


def sample_train(
    labelled: classification.LabelledData, config: ml_collections.ConfigDict
) -> classification.LabelledData:
    """`labelled` with only a stratified sample of `config.data.train_examples` training
    examples when that is set."""
    count = config.data.train_examples
    if not count:
        return labelled
    train = classification.stratified_sample(
        labelled.splits["train"], count, config.data.split_seed
    )
    return dataclasses.replace(labelled, splits={**labelled.splits, "train": train})


def labelled_data(config: ml_collections.ConfigDict) -> classification.LabelledData:
    """The bundled sentiment set (`config.data.dataset = "rotten_tomatoes"`) or the user's files
    (`config.data.train_file` [, `validation_file`, `test_file`])."""
    data = config.data
    if data.train_file:
        return reading.read_labelled_files(
            data.train_file,
            data.validation_file or None,
            data.test_file or None,
            regression=data.regression,
            seed=data.split_seed,
        )
    if data.dataset != "rotten_tomatoes":
        raise ValueError(
            f"config.data.dataset={data.dataset!r}: the bundled set is 'rotten_tomatoes'; "
            "for your own data set config.data.train_file (CSV/TSV/JSONL with text[, text_b], "
            "label) and optionally validation_file, test_file."
        )
    if data.regression:
        raise ValueError(
            "rotten_tomatoes is a classification set; set config.data.regression=False."
        )
    return reading.rotten_tomatoes(seed=data.split_seed)


def metric_names(config: ml_collections.ConfigDict, num_labels: int) -> tuple[list[str], str]:
    """(the metrics each evaluation reports, the one that judges the run): `config.eval.metrics`
    (comma-separated; "": accuracy, or MSE, Pearson and Spearman for regression) and
    `config.eval.metric` ("": the first of them)."""
    default = "mse,pearson,spearman" if num_labels == 1 else "accuracy"
    names = (config.eval.metrics or default).split(",")
    metrics.check_metrics(names, num_labels, "config.eval.metrics")
    main = config.eval.metric or names[0]
    if main not in names:
        raise ValueError(f"config.eval.metric={main!r} is not one of config.eval.metrics {names}.")
    return names, main


class ClassificationTask(FineTuningTask):
    """Fine-tuning `BertForSequenceClassification` on packed rows of labelled text."""

    name = "classification"
    predict_file = staticmethod(predict.predict_file)

    def __init__(self, config: ml_collections.ConfigDict):
        super().__init__(config)
        data = config.data
        self.labelled = sample_train(self.read_data(), config)
        self.vocab = task_vocab(config)
        self.encoded = {
            name: classification.encode_split(self.vocab, split, data.max_seq_length)
            for name, split in self.labelled.splits.items()
        }
        for name, split in self.encoded.items():
            if split.truncated:
                logging.warning(
                    "%d of %d %s examples are longer than max_seq_length=%d and were truncated "
                    "(BERT's longest-first rule).",
                    split.truncated,
                    len(split),
                    name,
                    data.max_seq_length,
                )
        self.metrics, self.eval_metric = metric_names(config, self.labelled.num_labels)
        higher = metrics.METRICS[self.eval_metric].higher_is_better
        self.eval_metric_mode = "max" if higher else "min"
        self.train_metrics_shown = (
            "classification_loss",
            "mse" if self.labelled.regression else "accuracy",
        )
        self.eval_metrics_shown = (
            *[name for name in self.metrics if name != self.eval_metric],
            *[f"{name}_{split}" for split in self.eval_splits[1:] for name in self.metrics],
            "classification_loss",
        )
        self.eval_sizes: list[int] = []  # batches of each evaluation split (eval_batches)

    def read_data(self) -> classification.LabelledData:
        """Every split of the task's data (before `sample_train`)."""
        return labelled_data(self.config)

    @property
    def objective(self) -> losses.Objective:
        return CLASSIFICATION

    def model(self, model_config: BertConfig) -> nn.Module:
        return BertForSequenceClassification(
            model_config, self.labelled.num_labels, self.config.classifier.pooling
        )

    def model_config(self) -> BertConfig:
        length = self.config.data.max_seq_length
        return model_config_from(self.config, length, self.vocab.size, "the tokenizer")

    def eval_batches(self, rows: int, vocab_size: int) -> list[Batch]:
        batches = [self.split_batches(split, rows) for split in self.eval_splits]
        self.eval_sizes = [len(split) for split in batches]
        return [batch for split in batches for batch in split]

    def score_outputs(self, outputs: list[dict[str, np.ndarray]]) -> dict[str, float]:
        """The metrics of each evaluation split (those after the first suffixed `_SPLIT`)."""
        found: dict[str, float] = {}
        ends = np.cumsum([0, *self.eval_sizes])
        for k, split in enumerate(self.eval_splits):
            part = outputs[ends[k] : ends[k + 1]]
            real = np.concatenate([out["mask"].reshape(-1) > 0 for out in part])
            logits = np.concatenate(
                [out["logits"].reshape(-1, self.labelled.num_labels) for out in part]
            )
            labels = np.concatenate([out["labels"].reshape(-1) for out in part])
            scored = metrics.scores(self.metrics, logits[real], labels[real])
            found.update({name if k == 0 else f"{name}_{split}": v for name, v in scored.items()})
        return found

    def baseline(self, eval_set: list[Batch]) -> tuple[str, float]:
        train = self.labelled.splits["train"].labels
        if self.labelled.regression:
            constant, name = float(np.mean(train)), f"predicting train's mean {np.mean(train):.3f}"
        else:
            constant = int(np.bincount(train).argmax())
            name = f"always predicting {self.labelled.label_names[constant]!r}"
        labels = self.labelled.splits[self.eval_splits[0]].labels
        value = metrics.METRICS[self.eval_metric].function(np.full_like(labels, constant), labels)
        return name, value

    def identity(self) -> str:
        summary = {
            "source": self.labelled.source,
            "sizes": {name: len(split) for name, split in self.labelled.splits.items()},
            "max_seq_length": self.config.data.max_seq_length,
            "vocab_size": self.vocab.size,
        }
        return data_identity("classification", summary, lowercase=self.vocab.lowercase)

    def check_batch(self, batch: Batch, model_config: BertConfig, *, evaluation: bool) -> None:
        contract.check_batch(batch, model_config, features=contract.CLASSIFICATION_FEATURES)
        if not self.labelled.regression:
            real = batch["sequence_mask"] > 0
            labels = batch["labels"][real]
            if labels.size and (labels.min() < 0 or labels.max() >= self.labelled.num_labels):
                raise ValueError(f"labels outside [0, {self.labelled.num_labels}).")

    def pretrained_params(self, pretraining_params: Any, params: Any) -> Any:
        rescale = self.config.classifier.rescale_embeddings
        return classifier_start(pretraining_params, params, rescale=rescale)

    def head_config(self) -> dict[str, Any]:
        return {
            "num_labels": self.labelled.num_labels,
            "label_names": self.labelled.label_names,
            "sentence_pairs": self.labelled.splits["train"].texts_b is not None,
            "pooling": self.config.classifier.pooling,
            "metrics": list(self.metrics),
            "vocab_file": self.vocab.path,  # as resolved (config.data.vocab_file may be "")
            "lowercase": self.vocab.lowercase,  # as resolved (config.data.lowercase may be None)
        }

    def predict_split(self, workdir: str, split: str) -> dict[str, Any]:
        """The best parameters' predictions on `split`, written to the workdir, and (if it is
        labelled) their metrics."""
        return predict.predict_split(workdir, self, split)

    def plot(self, workdir: str) -> list[str]:
        from bert_flax.runs import plots

        return [plots.plot_finetuning(workdir, self.eval_metric)]

    def describe(self) -> dict[str, Any]:
        return {
            "data": self.labelled.source,
            "examples": {name: len(split) for name, split in self.labelled.splits.items()},
            "label_balance": self.labelled.label_balance(),
            "truncated": {name: split.truncated for name, split in self.encoded.items()},
            "max_seq_length": self.config.data.max_seq_length,
            "max_sequences_per_row": self.depth,
        }
