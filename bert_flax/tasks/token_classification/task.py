"""`TokenClassificationTask`: fine-tuning `BertForTokenClassification` (NER, POS, chunking) on
CoNLL files, the TFDS `conll2003` builder or the bundled rule-tagged set, several sentences a
row, judged by entity F1 (`score_outputs`; token accuracy for the scheme "none")."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
from typing import Any

import flax.linen as nn
import ml_collections
import numpy as np
from absl import logging

from bert_flax.input_pipeline import contract
from bert_flax.model import losses
from bert_flax.model.config import BertConfig
from bert_flax.tasks.base import Batch, model_config_from
from bert_flax.tasks.finetuning import FineTuningTask, task_vocab
from bert_flax.tasks.token_classification import metrics, predict, rule_set
from bert_flax.tasks.token_classification.model import (
    TOKEN_CLASSIFICATION,
    BertForTokenClassification,
)
from bert_flax.tasks.token_classification.reading import (
    Sentence,
    check_labels,
    read_conll,
    read_tfds,
    unseen_labels,
)
from bert_flax.tasks.token_classification.rows import TOKEN_TASK_FEATURES, SentenceTable

SPLITS = ("train", "validation", "test")
TFDS_SPLITS = {"train": "train", "validation": "dev", "test": "test"}


@functools.cache
def bundled_rule_set(limit: int) -> dict[str, tuple[Sentence, ...]]:
    """The rule-tagged sentences of the bundled speeches by split (at most `limit` a split)."""
    return {
        split: tuple(rule_set.sentences(documents, limit))
        for split, documents in rule_set.split_speeches().items()
    }


def read_sentences(
    config: ml_collections.ConfigDict,
) -> tuple[dict[str, list[Sentence]], list[str] | None, str]:
    """(sentences by split, the label names if the source fixes them, where they came from):
    `config.data.train_file` [`validation_file`, `test_file`] (CoNLL), the TFDS builder
    `config.data.tfds_name` (`dataset = "tfds"`) or the rule set (`dataset = "rule_ner"`)."""
    data = config.data
    if data.train_file:
        if not data.validation_file:
            raise ValueError(
                "config.data.validation_file is empty: give the CoNLL file to evaluate on "
                "beside config.data.train_file."
            )
        named = {
            "train": data.train_file,
            "validation": data.validation_file,
            "test": data.test_file,
        }
        files = {s: path for s, path in named.items() if path}
        sentences = {
            s: read_conll(path, data.label_column, data.label_scheme) for s, path in files.items()
        }
        return sentences, None, ", ".join(f"{s}: {path}" for s, path in files.items())
    if data.dataset == "tfds":
        read = {s: read_tfds(data.tfds_name, t, data.tfds_label, data.tfds_data_dir)
                for s, t in TFDS_SPLITS.items()}  # fmt: skip
        names = read["train"][1]
        for sentences, _ in read.values():
            check_labels(sentences, data.label_scheme)
        return {s: r[0] for s, r in read.items()}, names, f"tfds:{data.tfds_name}/{data.tfds_label}"
    if data.dataset == "rule_ner":
        limit = data.rule_sentences
        sentences = {s: list(v) for s, v in bundled_rule_set(limit).items()}
        return sentences, list(rule_set.LABEL_NAMES), f"the bundled rule set ({limit or 'all'})"
    raise ValueError(
        f"config.data.dataset={data.dataset!r}: the bundled set is 'rule_ner', 'tfds' reads "
        "config.data.tfds_name; for CoNLL files set config.data.train_file and validation_file."
    )


def label_names_of(sentences: list[Sentence]) -> list[str]:
    """The labels of `sentences`: O first (when present), then sorted."""
    found = {label for s in sentences for label in s.labels or ()}
    if not found:
        raise ValueError("The training sentences have no labels: give a labelled CoNLL file.")
    return sorted(found, key=lambda name: (name != metrics.OUTSIDE, name))


class TokenClassificationTask(FineTuningTask):
    """A label for every word, from BERT's states at its sub-words, on packed rows."""

    name = "token_classification"
    train_metrics_shown = ("token_loss", "token_accuracy")
    predict_file = staticmethod(predict.predict_file)

    def __init__(self, config: ml_collections.ConfigDict):
        super().__init__(config)
        data = config.data
        self.file_scheme = data.label_scheme
        self.scheme = data.convert_to or data.label_scheme
        self.mode = config.token_classification.entity_mode
        metrics.check_scheme(self.scheme)
        metrics.check_mode(self.mode)
        self.sentences, self.label_names, self.source = self._read()
        self.vocab = task_vocab(config)
        self.lowercase = self.vocab.lowercase
        self.encoded = {split: self._table(split) for split in self.sentences}
        self.eval_metric = "token_accuracy" if self.scheme == "none" else "entity_f1"
        self.eval_metrics_shown = ("token_accuracy", "token_loss")

    def _read(self) -> tuple[dict[str, list[Sentence]], list[str], str]:
        """(sentences by split in the task's scheme, the label names, their source); the first
        `config.data.train_examples` / `validation_examples` when set."""
        sentences, names, source = read_sentences(self.config)
        sentences = {split: self._converted(v) for split, v in sentences.items()}
        data = self.config.data
        for split, count in (
            ("train", data.train_examples),
            ("validation", data.validation_examples),
        ):
            if count:
                sentences[split] = sentences[split][:count]
        if not names or self.scheme != self.file_scheme:  # converted: the new scheme's tags
            names = label_names_of(sentences["train"])
        for split in sentences.values():
            unseen_labels(split, names)
        return sentences, names, source

    def _converted(self, sentences: list[Sentence]) -> list[Sentence]:
        if self.scheme == self.file_scheme:
            return sentences
        convert = lambda labels: tuple(metrics.convert(labels, self.file_scheme, self.scheme))
        return [dataclasses.replace(s, labels=s.labels and convert(s.labels)) for s in sentences]

    def _table(self, split: str) -> SentenceTable:
        """The rows' table of `split` (its truncated sentences logged)."""
        data = self.config.data
        table = SentenceTable.build(
            self.sentences[split],
            self.vocab,
            {name: i for i, name in enumerate(self.label_names)},
            data.max_seq_length,
            data.label_all_subwords,
        )
        if table.truncated:
            logging.warning(
                "%d of %d %s sentences are longer than max_seq_length=%d and were cut (their "
                "last words are predicted O).",
                table.truncated,
                len(table),
                split,
                data.max_seq_length,
            )
        return table

    @property
    def objective(self) -> losses.Objective:
        return TOKEN_CLASSIFICATION

    def model(self, model_config: BertConfig) -> nn.Module:
        return BertForTokenClassification(model_config, len(self.label_names))

    def model_config(self) -> BertConfig:
        length = self.config.data.max_seq_length
        return model_config_from(self.config, length, self.vocab.size, "the tokenizer")

    def _golds(self, split: str) -> list[tuple[str, ...]]:
        return [s.labels for s in self.sentences[split]]

    def score_outputs(self, outputs: list[dict[str, np.ndarray]]) -> dict[str, float]:
        split = self.config.eval.split
        table = self.encoded[split]
        found = predict.word_predictions(outputs, table)
        tags = predict.word_tags(table, found, self.label_names, self.sentences[split])
        return metrics.score(self._golds(split), tags, self.scheme, self.mode)

    def baseline(self, eval_set: list[Batch]) -> tuple[str, float]:
        golds = self._golds(self.config.eval.split)
        counts = collections.Counter(label for labels in self._golds("train") for label in labels)
        majority = counts.most_common(1)[0][0]
        figures = metrics.score(golds, [[majority] * len(g) for g in golds], self.scheme, self.mode)
        return f"always predicting {majority!r}", figures[self.eval_metric]

    def identity(self) -> str:
        summary = {
            "source": self.source,
            "sentences": {split: len(v) for split, v in self.sentences.items()},
            "head": {k: v for k, v in self.head_config().items() if k != "vocab_file"},
            "vocab_size": self.vocab.size,
        }
        digest = hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()
        return f"token_classification:{digest[:16]}"

    def check_batch(self, batch: Batch, model_config: BertConfig, *, evaluation: bool) -> None:
        contract.check_batch(batch, model_config, features=contract.CORE_FEATURES)
        missing = [name for name in TOKEN_TASK_FEATURES if name not in batch]
        if missing:
            raise ValueError(f"A token-classification batch lacks {missing} (its rows.py).")
        labels = batch["token_labels"][batch["label_mask"] > 0]
        if labels.size and (labels.min() < 0 or labels.max() >= len(self.label_names)):
            raise ValueError(f"token_labels outside [0, {len(self.label_names)}).")

    def pretrained_params(self, pretraining_params: Any, params: Any) -> Any:
        if "classifier" in pretraining_params:  # already a token classifier (another run)
            return pretraining_params
        return {**params, "bert": pretraining_params["bert"]}

    def head_config(self) -> dict[str, Any]:
        data = self.config.data
        return {
            "label_names": list(self.label_names),
            "label_scheme": self.scheme,
            "entity_mode": self.mode,
            "file_scheme": self.file_scheme,
            "label_column": data.label_column,
            "label_all_subwords": data.label_all_subwords,
            "lowercase": self.lowercase,
            "max_seq_length": data.max_seq_length,
            "max_sequences_per_pack": self.depth,
            "algorithm": data.algorithm,
            "vocab_file": self.vocab.path,
        }

    def predict_split(self, workdir: str, split: str) -> dict[str, Any]:
        """The best parameters' tags for `split`, written to the workdir, and their scores."""
        return predict.predict_split(workdir, self.sentences[split], split)

    def plot(self, workdir: str) -> list[str]:
        from bert_flax.runs import plots

        return [plots.plot_finetuning(workdir, self.eval_metric, loss="token_loss")]

    def describe(self) -> dict[str, Any]:
        return {
            "data": self.source,
            "sentences": {split: len(v) for split, v in self.sentences.items()},
            "labels": list(self.label_names),
            "label_scheme": self.scheme,
            "truncated": {split: t.truncated for split, t in self.encoded.items()},
            "max_seq_length": self.config.data.max_seq_length,
            "max_sequences_per_row": self.depth,
        }
