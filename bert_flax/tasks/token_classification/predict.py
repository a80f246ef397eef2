"""Packed inference of a token classifier: one label per word, and the CoNLL file written.

    table = SentenceTable.build(sentences, vocab, label_ids, 128)
    found = infer(model_config, params, table, num_labels, max_sequences_per_pack=16)
    tags = word_tags(table, found, label_names, sentences)    # per sentence, per word
    write_conll("predicted.txt", sentences, tags)             # token gold predicted

`bert_flax.train --predict=FILE --workdir=W` runs all of it with the run's best parameters.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from bert_flax.data import tokenization
from bert_flax.model.config import BertConfig
from bert_flax.runs import parameters
from bert_flax.tasks.inference import predict_rows
from bert_flax.tasks.token_classification import metrics
from bert_flax.tasks.token_classification.model import TOKEN_INPUTS, BertForTokenClassification
from bert_flax.tasks.token_classification.reading import Sentence, read_conll, unseen_labels
from bert_flax.tasks.token_classification.rows import SentenceTable

PREDICTIONS_FILE = "predictions_{split}.txt"
SUMMARY_METRICS = ("entity_f1", "entity_precision", "entity_recall", "token_accuracy")


def word_predictions(
    outputs: Iterable[Mapping[str, np.ndarray]], table: SentenceTable
) -> dict[int, np.ndarray]:
    """Sentence index -> the label ids predicted at its kept words' first sub-words, read out
    of packed rows (`predictions` [B, L], `sentence_ids` and `cls_positions` [B, D])."""
    found = {}
    for out in outputs:
        for row, slot in zip(*np.nonzero(out["sentence_ids"] >= 0)):
            sentence = int(out["sentence_ids"][row, slot])
            columns = int(out["cls_positions"][row, slot]) + table.word_offsets[sentence]
            found[sentence] = np.asarray(out["predictions"][row, columns])
    if len(found) != len(table):
        raise RuntimeError(f"{len(table) - len(found)} sentences got no prediction.")
    return found


def word_tags(
    table: SentenceTable,
    found: Mapping[int, np.ndarray],
    label_names: Sequence[str],
    sentences: Sequence[Sentence],
) -> list[list[str]]:
    """Each sentence's predicted tags, one a word; words cut off by truncation get O."""
    return [
        [label_names[i] for i in found[k]] + [metrics.OUTSIDE] * (len(s.words) - len(found[k]))
        for k, s in enumerate(sentences)
    ]


def infer(
    model_config: BertConfig,
    params: Any,
    table: SentenceTable,
    num_labels: int,
    *,
    max_seq_length: int,
    max_sequences_per_pack: int,
    rows: int = 32,
    packed: bool = True,
    algorithm: str = "lpfhp",
    mesh: Mesh | None = None,
) -> dict[int, np.ndarray]:
    """Every sentence's predicted label ids per kept word, from packed rows (unless not
    `packed`) on `mesh` (default: every device, data parallel)."""
    batches = predict_rows(
        BertForTokenClassification(model_config, num_labels),
        params,
        table,
        inputs=TOKEN_INPUTS,
        outputs=lambda out: jnp.argmax(out.logits, axis=-1),
        max_seq_length=max_seq_length,
        max_sequences_per_pack=max_sequences_per_pack,
        packed=packed,
        algorithm=algorithm,
        rows=rows,
        mesh=mesh,
    )
    outputs = (
        {"predictions": out, **{k: batch[k] for k in ("sentence_ids", "cls_positions")}}
        for batch, out in batches
    )
    return word_predictions(outputs, table)


def write_conll(path: str, sentences: Sequence[Sentence], tags: Sequence[Sequence[str]]) -> None:
    """`word gold predicted` a line (gold O where unlabelled), a blank line after each sentence:
    what conlleval reads."""
    with open(path, "w", encoding="utf-8") as f:
        for sentence, predicted in zip(sentences, tags):
            gold = sentence.labels or [metrics.OUTSIDE] * len(sentence.words)
            for line in zip(sentence.words, gold, predicted):
                f.write(" ".join(line) + "\n")
            f.write("\n")


def predict_sentences(
    model_config: BertConfig, params: Any, head: Mapping[str, Any], sentences: Sequence[Sentence]
) -> list[list[str]]:
    """The predicted tags of `sentences` by a model saved with `head` (its `head_config`)."""
    vocab = tokenization.load_vocab(head["vocab_file"] or None, lowercase=head["lowercase"])
    names = head["label_names"]
    table = SentenceTable.build(
        sentences,
        vocab,
        {name: i for i, name in enumerate(names)},
        head["max_seq_length"],
        head["label_all_subwords"],
    )
    found = infer(
        model_config,
        params,
        table,
        len(names),
        max_seq_length=head["max_seq_length"],
        max_sequences_per_pack=head["max_sequences_per_pack"],
        algorithm=head["algorithm"],
    )
    return word_tags(table, found, names, sentences)


def write_predictions(
    model_config: BertConfig,
    params: Any,
    head: Mapping[str, Any],
    sentences: Sequence[Sentence],
    output: str,
) -> dict[str, float]:
    """Predicts `sentences`, writes them to `output` (CoNLL) and returns their scores (empty
    when unlabelled)."""
    tags = predict_sentences(model_config, params, head, sentences)
    write_conll(output, sentences, tags)
    if sentences[0].labels is None:
        return {}
    golds = [s.labels for s in sentences]
    return metrics.score(golds, tags, head["label_scheme"], head["entity_mode"])


def predict_split(workdir: str, sentences: Sequence[Sentence], split: str) -> dict[str, Any]:
    """The workdir's best parameters' tags for `sentences` (a split of the run's data), written
    to `workdir/predictions_SPLIT.txt`; their scores."""
    model_config, params, head = parameters.load_finetuned(workdir)
    path = os.path.join(workdir, PREDICTIONS_FILE.format(split=split))
    figures = write_predictions(model_config, params, head, sentences, path)
    return {**{k: figures[k] for k in SUMMARY_METRICS if k in figures}, "path": path}


def read_for_model(path: str, head: Mapping[str, Any]) -> list[Sentence]:
    """The CoNLL file `path` read as the model's training files were: its label column and
    scheme, converted to the model's; labels training never saw are an error."""
    sentences = read_conll(path, head["label_column"], head["file_scheme"])
    converted = [dataclasses.replace(s, labels=_convert(s.labels, head)) for s in sentences]
    unseen_labels(converted, head["label_names"])
    return converted


def _convert(labels: Sequence[str] | None, head: Mapping[str, Any]) -> tuple[str, ...] | None:
    if labels is None:
        return None
    return tuple(metrics.convert(labels, head["file_scheme"], head["label_scheme"]))


def predict_file(workdir: str, path: str, output: str | None) -> str:
    """Tags every word of the CoNLL file `path` with the workdir's best parameters, into a CoNLL
    file `output` (default: `path` + ".predicted"). Returns a one-line summary, with the entity
    F1 against the file's labels if it has them."""
    model_config, params, head = parameters.load_finetuned(workdir)
    sentences = read_for_model(path, head)
    output = output or os.path.abspath(path) + ".predicted"
    figures = write_predictions(model_config, params, head, sentences, output)
    summary = f"{len(sentences)} sentences -> {output}"
    shown = [k for k in SUMMARY_METRICS if k in figures]
    return " | ".join([summary, *(f"{k} {figures[k]:.4f}" for k in shown)])
