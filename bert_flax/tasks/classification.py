"""Fine-tuning: `BertForSequenceClassification` (classification or regression) on packed rows of
labelled text (`bert_flax.data.classification`), one epoch of batches at a time."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging

from bert_flax import losses, parameters
from bert_flax.config import BertConfig
from bert_flax.data import classification, contract, tokenization
from bert_flax.data.rows import epoch_seed
from bert_flax.model import (
    BertForSequenceClassification,
    pretrained_encoder,
    rescale_embeddings,
)
from bert_flax.tasks.base import Batch, Task, model_config_from


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


class ClassificationTask(Task):
    """Fine-tuning `BertForSequenceClassification` on packed rows of labelled text."""

    eval_metrics_shown = ("classification_loss",)

    def __init__(self, config: ml_collections.ConfigDict):
        super().__init__(config)
        data = config.data
        self.labelled = labelled_data(config)
        self.vocab = tokenization.load_vocab(data.vocab_file or self._pretrained_vocab_file())
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

    def _pretrained_vocab_file(self) -> str | None:
        """`config.init_from`'s vocabulary, where it says (None: bert-base-uncased's)."""
        init_from = self.config.get("init_from")
        vocab_file = parameters.pretrained_vocab_file(init_from) if init_from else None
        if vocab_file:
            logging.info("Tokenizing with %s, the vocabulary of %s", vocab_file, init_from)
        return vocab_file

    @property
    def depth(self) -> int:
        """Sequence slots per row (1 when padded)."""
        return self.config.data.max_sequences_per_pack if self.config.data.packed else 1

    @property
    def objective(self) -> losses.Objective:
        return losses.CLASSIFICATION

    def model(self, model_config: BertConfig) -> nn.Module:
        return BertForSequenceClassification(
            model_config, self.labelled.num_labels, self.config.classifier.pooling
        )

    def model_config(self) -> BertConfig:
        length = self.config.data.max_seq_length
        return model_config_from(self.config, length, self.vocab.size, "the tokenizer")

    @functools.cached_property
    def epoch_rows(self) -> list[list[int]]:
        """The train split's rows of epoch 0 (every epoch packs the same lengths into as many
        rows); computed once for the packing factor and the steps per epoch."""
        data = self.config.data
        return classification.pack_examples(
            self.encoded["train"].lengths,
            data.max_seq_length,
            self.depth,
            algorithm=data.algorithm,
            seed=epoch_seed(self.config.seed, 0),
            packed=data.packed,
        )

    def packing_factor(self) -> float:
        return classification.packing_factor(self.epoch_rows) if self.config.data.packed else 1.0

    def _batches(self, split: str, rows: int, **kwargs: Any) -> Iterator[Batch]:
        data = self.config.data
        return classification.batches(
            self.encoded[split],
            batch_size=rows // jax.process_count(),
            max_seq_length=data.max_seq_length,
            max_sequences_per_pack=self.depth,
            packed=data.packed,
            algorithm=data.algorithm,
            seed=self.config.seed,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            **kwargs,
        )

    def synthetic_batch(self, rows: int, seed: int) -> Batch:
        """The first `rows` rows of the validation split (real rows of the right shape)."""
        batch = next(
            self._batches("validation", rows * jax.process_count(), shuffle=False, pad_final=True)
        )
        return {name: value[:rows] for name, value in batch.items()}

    def steps_per_epoch(self, global_rows: int) -> int:
        return len(self.epoch_rows) // global_rows

    def train_batches(self, rows: int, vocab_size: int, *, start: int = 0) -> Iterator[Batch]:
        per_epoch = self.steps_per_epoch(rows)
        if per_epoch == 0:
            raise ValueError(
                f"The train split makes {len(self.epoch_rows)} rows, fewer than one batch of "
                f"{rows}; lower config.train.batch_size."
            )
        first_epoch, skip = divmod(start, per_epoch)
        for epoch in itertools.count(first_epoch):
            batches = self._batches("train", rows, epoch=epoch, shuffle=self.config.data.shuffle)
            yield from itertools.islice(batches, skip if epoch == first_epoch else 0, None)

    def eval_batches(self, rows: int, vocab_size: int) -> list[Batch]:
        split = self.config.eval.split
        return list(self._batches(split, rows, shuffle=False, pad_final=True))

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
        digest = hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()
        return f"classification:{digest[:16]}"

    def check_batch(self, batch: Batch, model_config: BertConfig, *, evaluation: bool) -> None:
        contract.check_batch(batch, model_config, features=contract.CLASSIFICATION_FEATURES)
        if not self.labelled.regression:
            real = batch["sequence_mask"] > 0
            labels = batch["labels"][real]
            if labels.size and (labels.min() < 0 or labels.max() >= self.labelled.num_labels):
                raise ValueError(f"labels outside [0, {self.labelled.num_labels}).")

    def pretrained_params(self, pretraining_params: Any, params: Any) -> Any:
        if "head" in pretraining_params:  # already a classifier (another fine-tuning run)
            return pretraining_params
        encoder = pretrained_encoder(pretraining_params, params)
        if self.config.classifier.rescale_embeddings:
            return rescale_embeddings(encoder, like=params)
        return encoder

    def head_config(self) -> dict[str, Any]:
        return {
            "num_labels": self.labelled.num_labels,
            "label_names": self.labelled.label_names,
            "sentence_pairs": self.labelled.splits["train"].texts_b is not None,
            "pooling": self.config.classifier.pooling,
            "vocab_file": self.vocab.path,  # as resolved (config.data.vocab_file may be "")
        }

    def plot(self, workdir: str) -> list[str]:
        from bert_flax import plots

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
