"""`GlueTask`: a GLUE task (`config.glue.task`) fine-tuned as a `ClassificationTask`, read from
the GLUE download's folder, TFDS or the Hugging Face export (`reading.py`), scored by its
official metrics (`config.eval.metrics`, from `table.GLUE`), and ending with the GLUE server's
submission files of its test splits (MNLI's model also predicts the diagnostic set, AX)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections
from absl import logging

from bert_flax.tasks.classification import metrics, predict
from bert_flax.tasks.classification.data import LabelledData, is_labelled
from bert_flax.tasks.classification.task import ClassificationTask
from bert_flax.tasks.glue import reading
from bert_flax.tasks.glue.submission import write_submission
from bert_flax.tasks.glue.table import GLUE, Spec

AX_SPLIT = "ax"  # MNLI's split holding the diagnostic set


def glue_spec(key: str) -> Spec:
    """The table's row of `key` (`config.glue.task`)."""
    if key not in GLUE:
        raise ValueError(f"config.glue.task={key!r} is not one of {sorted(GLUE)}.")
    return GLUE[key]


def parse_files(files: str, spec: Spec) -> dict[str, str]:
    """`config.data.files` ("train=a.csv,validation=b.parquet,...") as {split: path}, checked
    to name train and every evaluation split."""
    pairs = [item.split("=", 1) for item in files.split(",") if item.strip()]
    found = {name.strip(): path.strip() for name, path in (p for p in pairs if len(p) == 2)}
    needed = ["train", *spec.eval_splits]
    missing = [name for name in needed if name not in found]
    if len(found) != len(pairs) or missing:
        optional = [s for s in spec.splits if s not in needed] + (["ax"] * (spec.key == "mnli"))
        raise ValueError(
            f"config.data.files={files!r} must name {needed} (and optionally {optional}) as "
            "split=path, separated by commas."
        )
    return found


def read_source(spec: Spec, data: ml_collections.ConfigDict) -> LabelledData:
    """`spec`'s splits from `config.data.glue_dir`, `files` or TFDS (`dataset="tfds"`; the first
    set)."""
    if data.glue_dir:
        return reading.read_glue_dir(spec, data.glue_dir)
    if data.files:
        return reading.read_files(spec, parse_files(data.files, spec))
    if data.dataset == "tfds":
        return reading.read_tfds(spec, data.tfds_data_dir or None)
    raise ValueError(
        "Say where GLUE is: config.data.glue_dir (the GLUE download's folder), "
        "config.data.files (split=path,... of the Hugging Face export) or config.data.dataset=tfds."
    )


def with_diagnostic(labelled: LabelledData, data: ml_collections.ConfigDict) -> LabelledData:
    """MNLI's data with the diagnostic set (AX) as split `ax`, where the source has it."""
    ax = GLUE["ax"]
    try:
        if data.glue_dir:
            split = reading.read_glue_dir(ax, data.glue_dir).splits["test"]
        elif data.dataset == "tfds":
            split = reading.read_tfds(ax, data.tfds_data_dir or None).splits["test"]
        else:
            return labelled  # files: an `ax=PATH` entry is read with the others
    except FileNotFoundError as error:
        logging.warning("No diagnostic set (AX.tsv is not written): %s", error)
        return labelled
    return dataclasses.replace(labelled, splits={**labelled.splits, AX_SPLIT: split})


def predict_file(workdir: str, path: str, output: str | None) -> str:
    """`bert_flax.train --predict` of a GLUE run: the workdir's best parameters over `path` (the
    task's TSV or Hugging Face export columns) as JSON lines at `output` (default beside
    `path`); a labelled file is also scored with the task's metrics. Returns a summary line."""
    split, encoded, logits, head = predict.file_logits(
        workdir, lambda head: reading.read_file(GLUE[head["glue_task"]], path)
    )
    output = output or os.path.splitext(path)[0] + ".predictions.jsonl"
    predict.write_predictions(output, encoded.ids, logits, head["label_names"])
    summary = f"{len(encoded)} predictions -> {output}"
    if not is_labelled(split.labels):
        return summary
    scores = metrics.scores(head["metrics"], logits, split.labels)
    return f"{summary}; " + ", ".join(f"{name} {value:.4f}" for name, value in scores.items())


class GlueTask(ClassificationTask):
    """Fine-tuning on one GLUE task; `predict_test` writes its submission files."""

    name = "glue"
    predict_file = staticmethod(predict_file)

    @property
    def spec(self) -> Spec:
        return glue_spec(self.config.glue.task)

    def read_data(self) -> LabelledData:
        labelled = read_source(self.spec, self.config.data)
        if self.spec.key == "mnli":
            return with_diagnostic(labelled, self.config.data)
        return labelled

    def submissions(self) -> dict[str, tuple[str, Spec]]:
        """{split: (submission file, the table row that writes it)} of the splits at hand."""
        found = {
            split: (self.spec.splits[split].submission, self.spec)
            for split in self.spec.test_splits
        }
        if self.spec.key == "mnli":
            found[AX_SPLIT] = (GLUE["ax"].splits["test"].submission, GLUE["ax"])
        return {split: found[split] for split in found if split in self.encoded}

    def predict_test(self, workdir: str) -> dict[str, Any]:
        """The submission file of each test split, from the best parameters, in `workdir`."""
        written = {}
        for split, (name, spec) in self.submissions().items():
            logits, _ = predict.split_logits(workdir, self, split)
            path = os.path.join(workdir, name)
            written[name] = write_submission(path, spec, self.encoded[split].ids, logits)
            logging.info("%d %s predictions -> %s", written[name], split, path)
        return {"submissions": written}

    def head_config(self) -> dict[str, Any]:
        return {**super().head_config(), "glue_task": self.spec.key}
