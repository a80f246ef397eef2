"""Packed inference of a fine-tuned classifier: logits per example, and the JSON lines written.

logits = predict(model_config, params, num_labels, encoded)    # [N, num_labels], input order
write_predictions("predictions.jsonl", encoded.ids, logits, label_names)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh

from bert_flax.data import tokenization
from bert_flax.input_pipeline import contract
from bert_flax.model.config import BertConfig
from bert_flax.runs import parameters
from bert_flax.tasks.classification import data, metrics, reading
from bert_flax.tasks.classification.model import BertForSequenceClassification
from bert_flax.tasks.inference import predict_rows

PREDICTIONS_FILE = "predictions_{split}.jsonl"


def predict(
    model_config: BertConfig,
    params: Any,
    num_labels: int,
    encoded: data.EncodedSplit,
    *,
    rows: int = 32,
    max_sequences_per_pack: int = 8,
    packed: bool = True,
    algorithm: str = "lpfhp",
    pooling: str = "cls",
    mesh: Mesh | None = None,
) -> np.ndarray:
    """Outputs per example of `encoded`, in its order: logits [N, num_labels] float32.

    Several examples per row when `packed`; each example's output depends only on its own
    tokens (block-diagonal attention), so packed and padded inference agree example by example.
    Runs on `mesh` (default: every device, data parallel), each batch of `rows`
    (rounded up to a multiple of the data-parallel size) split over the batch axes.
    """
    batches = predict_rows(
        BertForSequenceClassification(model_config, num_labels, pooling),
        params,
        encoded,
        inputs=contract.CLASSIFICATION_INPUTS,
        outputs=lambda out: out.logits,
        max_seq_length=encoded.max_seq_length,
        max_sequences_per_pack=max_sequences_per_pack,
        packed=packed,
        algorithm=algorithm,
        rows=rows,
        mesh=mesh,
    )
    position = {int(example_id): k for k, example_id in enumerate(encoded.ids)}
    logits = np.full((len(encoded), num_labels), np.nan, np.float32)
    for batch, out in batches:
        real = batch["example_ids"] >= 0
        for example_id, value in zip(batch["example_ids"][real], out[real]):
            logits[position[int(example_id)]] = value
    if np.isnan(logits).any():
        raise RuntimeError("Some examples got no prediction; the packer lost them.")
    return logits


def write_predictions(
    path: str, ids: Sequence[int], logits: np.ndarray, label_names: Sequence[str] | None
) -> None:
    """One JSON line per example, in input order: its id and prediction (label and
    probabilities, or the regression value)."""
    with open(path, "w") as f:
        for example_id, row in zip(ids, logits):
            record: dict[str, Any] = {"id": int(example_id)}
            if label_names is None:
                record["prediction"] = float(row[0])
            else:
                probabilities = np.exp(row - row.max())
                probabilities /= probabilities.sum()
                record["label"] = label_names[int(np.argmax(row))]
                record["probabilities"] = [round(float(p), 6) for p in probabilities]
            f.write(json.dumps(record) + "\n")


def check_kind(split: data.LabelledSplit, head: dict, path: str, workdir: str) -> None:
    """ValueError unless `path` holds the kind of examples (single texts or sentence pairs) the
    model was fine-tuned on (models fine-tuned before `sentence_pairs` was recorded: any)."""
    kinds = {False: "single texts (no `text_b` column)", True: "sentence pairs (`text_b`)"}
    pairs = split.texts_b is not None
    if head.get("sentence_pairs", pairs) != pairs:
        raise ValueError(
            f"{path} holds {kinds[pairs]}, but the model in {workdir} was fine-tuned on "
            f"{kinds[not pairs]}: give a file of its task."
        )


def file_logits(
    workdir: str, read: Callable[[dict[str, Any]], data.LabelledSplit]
) -> tuple[data.LabelledSplit, data.EncodedSplit, np.ndarray, dict[str, Any]]:
    """(split, its encoding, logits [N, num_labels], head config) of the examples `read(head)`
    gives, encoded as the run in `workdir` was (its vocabulary, case and row length) and packed
    through its best parameters: what every classifier's `predict_file` starts from."""
    model_config, params, head = parameters.load_finetuned(workdir)
    with open(os.path.join(workdir, "config.json")) as f:
        config_data = json.load(f)["data"]
    vocab_file = head.get("vocab_file") or config_data.get("vocab_file") or None
    vocab = tokenization.load_vocab(vocab_file, lowercase=head.get("lowercase", True))
    split = read(head)
    encoded = data.encode_split(vocab, split, config_data["max_seq_length"])
    logits = predict(
        model_config,
        params,
        head["num_labels"],
        encoded,
        max_sequences_per_pack=config_data["max_sequences_per_pack"],
        algorithm=config_data["algorithm"],
        pooling=head.get("pooling", "cls"),  # models fine-tuned before pooling existed: cls
    )
    return split, encoded, logits, head


def read_texts_of_task(path: str, workdir: str) -> Callable[[dict[str, Any]], data.LabelledSplit]:
    """`file_logits`'s reader of a CSV/TSV/JSONL file of texts (text[, text_b]), checked to be
    of the kind the model was fine-tuned on."""

    def read(head: dict[str, Any]) -> data.LabelledSplit:
        split = reading.read_texts(path)
        check_kind(split, head, path, workdir)
        return split

    return read


def predict_file(workdir: str, path: str, output: str | None) -> str:
    """Classifies the texts of `path` (CSV/TSV/JSONL: text[, text_b]) with the workdir's best
    parameters into JSON lines at `output` (default beside `path`); returns a one-line summary."""
    _, encoded, logits, head = file_logits(workdir, read_texts_of_task(path, workdir))
    output = output or os.path.splitext(path)[0] + ".predictions.jsonl"
    write_predictions(output, encoded.ids, logits, head["label_names"])
    return f"{len(encoded)} predictions -> {output}"


def split_logits(workdir: str, task, split: str) -> tuple[np.ndarray, dict[str, Any]]:
    """(logits [N, num_labels] of the workdir's best parameters on `task`'s `split`, in its
    order; the head config)."""
    model_config, params, head = parameters.load_finetuned(workdir)
    config = task.config
    logits = predict(
        model_config,
        params,
        head["num_labels"],
        task.encoded[split],
        rows=config.eval.batch_size,
        max_sequences_per_pack=task.depth,
        packed=config.data.packed,
        algorithm=config.data.algorithm,
        pooling=head.get("pooling", "cls"),
    )
    return logits, head


def predict_split(workdir: str, task, split: str) -> dict[str, Any]:
    """The best parameters' predictions on `task`'s `split`, written to the workdir; returns
    their path and, for a labelled split, the task's metrics (`task.metrics`) against its
    labels."""
    logits, head = split_logits(workdir, task, split)
    encoded = task.encoded[split]
    path = os.path.join(workdir, PREDICTIONS_FILE.format(split=split))
    write_predictions(path, encoded.ids, logits, head["label_names"])
    if not data.is_labelled(encoded.labels):
        return {"path": path}
    return {**metrics.scores(task.metrics, logits, encoded.labels), "path": path}
