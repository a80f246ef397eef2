"""Fine-tuning: `BertForSequenceClassification` (classification or regression) on packed rows of
labelled text (`data.py`), one epoch of batches at a time."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import ml_collections
import numpy as np
from absl import logging

from bert_flax.data import contract
from bert_flax.model import losses
from bert_flax.model.config import BertConfig
from bert_flax.tasks.base import Batch, data_identity, model_config_from
from bert_flax.tasks.classification import data as classification
from bert_flax.tasks.classification import predict
from bert_flax.tasks.classification.model import (
    CLASSIFICATION,
    BertForSequenceClassification,
    classifier_start,
)
from bert_flax.tasks.finetuning import FineTuningTask, task_vocab


def labelled_data(config: ml_collections.ConfigDict) -> classification.LabelledData:
    """The bundled sentiment set (`config.data.dataset = "rotten_tomatoes"`) or the user's files
    (`config.data.train_file` [, `validation_file`, `test_file`]), with only a stratified sample
    of `config.data.train_examples` training examples when that is set."""
    labelled = _all_labelled_data(config)
    count = config.data.get("train_examples", 0)
    if not count:
        return labelled
    train = classification.stratified_sample(
        labelled.splits["train"], count, config.data.split_seed
    )
    return dataclasses.replace(labelled, splits={**labelled.splits, "train": train})


def _all_labelled_data(config: ml_collections.ConfigDict) -> classification.LabelledData:
    data = config.data
    if data.train_file:
        return classification.read_labelled_files(
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
    return classification.rotten_tomatoes(seed=data.split_seed)


class ClassificationTask(FineTuningTask):
    """Fine-tuning `BertForSequenceClassification` on packed rows of labelled text."""

    name = "classification"
    eval_metrics_shown = ("classification_loss",)
    predict_file = staticmethod(predict.predict_file)

    def __init__(self, config: ml_collections.ConfigDict):
        super().__init__(config)
        data = config.data
        self.labelled = labelled_data(config)
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
        if self.labelled.regression:
            self.eval_metric, self.eval_metric_mode = "mse", "min"
        else:
            self.eval_metric, self.eval_metric_mode = "accuracy", "max"
        self.train_metrics_shown = ("classification_loss", self.eval_metric)

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

    def baseline(self, eval_set: list[Batch]) -> tuple[str, float]:
        split = self.config.eval.split
        if self.labelled.regression:
            mean = float(np.mean(self.labelled.splits["train"].labels))
            targets = self.labelled.splits[split].labels
            return f"predicting train's mean {mean:.3f}", float(np.mean((targets - mean) ** 2))
        majority = int(np.bincount(self.labelled.splits["train"].labels).argmax())
        name = self.labelled.label_names[majority]
        return f"always predicting {name!r}", self.labelled.majority_baseline(split)

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
            "vocab_file": self.vocab.path,  # as resolved (config.data.vocab_file may be "")
            "lowercase": self.vocab.lowercase,  # as resolved (config.data.lowercase may be None)
        }

    def predict_split(self, workdir: str, split: str) -> dict[str, Any]:
        """The best parameters' predictions on `split`, written to the workdir, and their
        accuracy (or MSE)."""
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
