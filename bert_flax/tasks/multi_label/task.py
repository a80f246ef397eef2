"""`MultiLabelTask`: fine-tuning `BertForSequenceClassification` with a sigmoid per label on
packed rows, scored by micro and macro F1 at the threshold that is best on validation."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import flax.linen as nn
import ml_collections
import numpy as np
from scipy import special

from bert_flax.input_pipeline import contract
from bert_flax.model import losses
from bert_flax.model.config import BertConfig
from bert_flax.tasks.base import Batch, data_identity, model_config_from
from bert_flax.tasks.classification import predict as classification_predict
from bert_flax.tasks.classification import reading as classification_reading
from bert_flax.tasks.classification.model import BertForSequenceClassification, classifier_start
from bert_flax.tasks.finetuning import FineTuningTask, task_vocab
from bert_flax.tasks.multi_label import data, metrics
from bert_flax.tasks.multi_label.model import MULTI_LABEL

PREDICTIONS_FILE = "predictions_{split}.jsonl"
# The bundled set's labels, by rules a model can learn from the text (`review_tags`).
REVIEW_TAGS = {
    "film": re.compile(r"\b(film|films|movie|movies)\b", re.IGNORECASE),
    "exclaims": re.compile(r"[!?]"),
}


def review_tags(seed: int = 0) -> data.MultiLabelData:
    """The bundled Rotten Tomatoes snippets with three labels each may have: `fresh` (the
    critic's verdict), `film` (it says film(s) or movie(s)) and `exclaims` (it has ! or ?)."""
    sentiment = classification_reading.rotten_tomatoes(seed=seed)
    splits = {}
    for name, split in sentiment.splits.items():
        flags = [split.labels == 1]
        flags += [[bool(rule.search(t)) for t in split.texts] for rule in REVIEW_TAGS.values()]
        targets = np.stack(flags, axis=1).astype(np.float32)
        splits[name] = data.MultiLabelSplit(split.texts, None, targets, split.ids)
    names = ["fresh", *REVIEW_TAGS]
    return data.MultiLabelData(splits, names, f"{sentiment.source}; tags {names} by rule")


def multi_label_data(config: ml_collections.ConfigDict) -> data.MultiLabelData:
    """The user's files (`config.data.train_file` [, validation_file, test_file]) or the
    bundled `review_tags` set (`config.data.dataset = "review_tags"`); with
    `config.data.train_examples`, a random sample of that many training examples (`split_seed`)."""
    labelled = _all_multi_label_data(config)
    count = config.data.train_examples
    if not count:
        return labelled
    train = labelled.splits["train"]
    if not 0 < count <= len(train):
        raise ValueError(
            f"config.data.train_examples={count}: the train split has {len(train)}; ask for 1 "
            f"to {len(train)} (0: all of them)."
        )
    chosen = np.sort(np.random.default_rng(config.data.split_seed).permutation(len(train))[:count])
    splits = {**labelled.splits, "train": data.select(train, chosen)}
    return dataclasses.replace(labelled, splits=splits)


def _all_multi_label_data(config: ml_collections.ConfigDict) -> data.MultiLabelData:
    d = config.data
    if d.train_file:
        return data.read_multi_label_files(
            d.train_file,
            d.validation_file or None,
            d.test_file or None,
            label_columns=tuple(c for c in d.label_columns.split(",") if c),
            separator=d.label_separator,
            seed=d.split_seed,
        )
    if d.dataset != "review_tags":
        raise ValueError(
            f"config.data.dataset={d.dataset!r}: the bundled set is 'review_tags'; for your own "
            "data set config.data.train_file (CSV/TSV/JSONL with text[, text_b] and labels)."
        )
    return review_tags(seed=d.split_seed)


class MultiLabelTask(FineTuningTask):
    """Several labels per example: a sigmoid and binary cross-entropy per label."""

    name = "multi_label"
    eval_metric = "micro_f1"
    eval_metrics_shown = ("multi_label_loss", "macro_f1", "threshold")
    train_metrics_shown = ("multi_label_loss", "label_accuracy")

    def __init__(self, config: ml_collections.ConfigDict):
        super().__init__(config)
        self.labelled = multi_label_data(config)
        self.vocab = task_vocab(config)
        length = config.data.max_seq_length
        self.encoded = {
            name: data.encode(self.vocab, split, length)
            for name, split in self.labelled.splits.items()
        }

    @property
    def num_labels(self) -> int:
        return len(self.labelled.label_names)

    @property
    def objective(self) -> losses.Objective:
        return MULTI_LABEL

    def model(self, model_config: BertConfig) -> nn.Module:
        pooling = self.config.classifier.pooling
        return BertForSequenceClassification(model_config, self.num_labels, pooling)

    def model_config(self) -> BertConfig:
        length = self.config.data.max_seq_length
        return model_config_from(self.config, length, self.vocab.size, "the tokenizer")

    def score_outputs(self, outputs: list[dict[str, np.ndarray]]) -> dict[str, float]:
        real = [out["sequence_mask"] > 0 for out in outputs]
        probabilities = np.concatenate([o["probabilities"][r] for o, r in zip(outputs, real)])
        targets = np.concatenate([o["multi_labels"][r] for o, r in zip(outputs, real)])
        return metrics.scores(
            targets, probabilities, metrics.tune_threshold(targets, probabilities)
        )

    def baseline(self, eval_set: list[Batch]) -> tuple[str, float]:
        frequency = self.labelled.splits["train"].targets.mean(axis=0)
        targets = self.labelled.splits[self.config.eval.split].targets
        constant = np.broadcast_to(frequency, targets.shape)
        threshold = metrics.tune_threshold(targets, constant)
        value = metrics.scores(targets, constant, threshold)["micro_f1"]
        return "predicting the labels frequent in train", value

    def identity(self) -> str:
        summary = {
            "source": self.labelled.source,
            "labels": self.labelled.label_names,
            "sizes": {name: len(split) for name, split in self.labelled.splits.items()},
            "max_seq_length": self.config.data.max_seq_length,
            "vocab_size": self.vocab.size,
        }
        return data_identity("multi_label", summary, lowercase=self.vocab.lowercase)

    def check_batch(self, batch: Batch, model_config: BertConfig, *, evaluation: bool) -> None:
        contract.check_batch(batch, model_config, features=contract.MULTI_LABEL_FEATURES)
        expected = (*batch["sequence_mask"].shape, self.num_labels)
        if batch["multi_labels"].shape != expected:
            raise ValueError(
                f"multi_labels has shape {batch['multi_labels'].shape}, not {expected}."
            )

    def pretrained_params(self, pretraining_params: Any, params: Any) -> Any:
        rescale = self.config.classifier.rescale_embeddings
        return classifier_start(pretraining_params, params, rescale=rescale)

    def head_config(self) -> dict[str, Any]:
        return {
            "num_labels": self.num_labels,
            "label_names": self.labelled.label_names,
            "multi_label": True,
            "sentence_pairs": self.labelled.splits["train"].texts_b is not None,
            "pooling": self.config.classifier.pooling,
            "vocab_file": self.vocab.path,
            "lowercase": self.vocab.lowercase,
        }

    def predict_split(self, workdir: str, split: str) -> dict[str, Any]:
        """The best parameters' labels for `split` (at the best evaluation's threshold), written
        to the workdir, and their micro/macro F1."""
        logits, head = classification_predict.split_logits(workdir, self, split)
        probabilities = special.expit(logits)
        path = os.path.join(workdir, PREDICTIONS_FILE.format(split=split))
        threshold = head["eval"]["threshold"]
        write_predictions(path, self.encoded[split].ids, probabilities, head, threshold)
        targets = self.labelled.splits[split].targets
        return {**metrics.scores(targets, probabilities, threshold), "path": path}

    @staticmethod
    def predict_file(workdir: str, path: str, output: str | None, **options: Any) -> str:
        """Labels the texts of `path` (CSV/TSV/JSONL: text[, text_b]) with the workdir's best
        parameters at its tuned threshold, as JSON lines at `output` (default beside `path`)."""
        read = classification_predict.read_texts_of_task(path, workdir)
        _, encoded, logits, head = classification_predict.file_logits(workdir, read)
        probabilities = special.expit(logits)
        output = output or os.path.splitext(path)[0] + ".predictions.jsonl"
        write_predictions(output, encoded.ids, probabilities, head, head["eval"]["threshold"])
        return f"{len(encoded)} predictions -> {output}"

    def plot(self, workdir: str) -> list[str]:
        from bert_flax.runs import plots

        return [plots.plot_finetuning(workdir, self.eval_metric)]

    def describe(self) -> dict[str, Any]:
        return {
            "data": self.labelled.source,
            "labels": self.labelled.label_names,
            "examples": {name: len(split) for name, split in self.labelled.splits.items()},
            "label_frequency": {
                name: dict(zip(self.labelled.label_names, split.targets.mean(0).round(3).tolist()))
                for name, split in self.labelled.splits.items()
            },
            "max_sequences_per_row": self.depth,
        }


def write_predictions(
    path: str, ids: np.ndarray, probabilities: np.ndarray, head: dict[str, Any], threshold: float
) -> None:
    """One JSON line per example, in input order: its id, the labels at `threshold` and each
    label's probability."""
    names = head["label_names"]
    with open(path, "w") as f:
        for example_id, row in zip(ids, probabilities):
            record = {
                "id": int(example_id),
                "labels": [name for name, p in zip(names, row) if p >= threshold],
                "probabilities": {name: round(float(p), 6) for name, p in zip(names, row)},
            }
            f.write(json.dumps(record) + "\n")
