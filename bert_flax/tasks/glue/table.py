"""The GLUE benchmark in one table: per task its files and columns as distributed (the GLUE
download's TSVs, TFDS `glue/<key>` and the Hugging Face `datasets` export), its labels, metrics
and the GLUE server's submission files.

    GLUE["mrpc"].metrics                        # ("f1", "accuracy"): F1 is the main metric
    GLUE["mnli"].splits["validation_mismatched"].file     # "dev_mismatched"

Label ids are those of TFDS and Hugging Face (`label_names[i]` names id i); `tsv_labels[i]` is
how the download's TSVs and the submission files write it.
"""

from __future__ import annotations

import dataclasses

ENTAILMENT_3 = ("entailment", "neutral", "contradiction")
ENTAILMENT_2 = ("entailment", "not_entailment")
BINARY = ("0", "1")


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of a task: its file in the download's folder (no `.tsv`), whether it has
    labels, and (test splits) the submission file its predictions go to."""

    file: str
    labelled: bool = True
    submission: str = ""


@dataclasses.dataclass(frozen=True)
class Spec:
    """One task of the benchmark."""

    key: str  # configs/glue.py:<key>, TFDS glue/<key>
    folder: str  # its folder in the GLUE download
    tsv_texts: tuple[str, ...]  # the text column(s) of the download's TSVs
    tsv_label: str  # their label column
    texts: tuple[str, ...]  # the text column(s) of TFDS and the Hugging Face export
    label_names: tuple[str, ...] | None  # None: regression (STS-B, scores 0..5)
    tsv_labels: tuple[str, ...] | None  # id i as the TSVs and submissions write it
    metrics: tuple[str, ...]  # the first is the main metric (bert_flax.tasks.classification)
    splits: dict[str, Split]
    tsv_index: str = "index"  # the test files' example index column
    # Train and dev TSVs without a header (CoLA): their columns in order.
    headerless: tuple[str, ...] = ()

    @property
    def eval_splits(self) -> list[str]:
        """The labelled splits each evaluation scores (MNLI: matched, then mismatched)."""
        return [name for name, split in self.splits.items() if split.labelled and name != "train"]

    @property
    def test_splits(self) -> list[str]:
        return [name for name, split in self.splits.items() if split.submission]


def _splits(submission: str) -> dict[str, Split]:
    """train, validation (dev.tsv) and test, predicted into `submission`."""
    return {
        "train": Split("train"),
        "validation": Split("dev"),
        "test": Split("test", labelled=False, submission=submission),
    }


PAIR = ("sentence1", "sentence2")
GLUE: dict[str, Spec] = {
    task.key: task
    for task in (
        Spec("cola", "CoLA", ("sentence",), "label", ("sentence",),
             ("unacceptable", "acceptable"), BINARY, ("mcc",), _splits("CoLA.tsv"),
             headerless=("source", "label", "original_label", "sentence")),
        Spec("sst2", "SST-2", ("sentence",), "label", ("sentence",),
             ("negative", "positive"), BINARY, ("accuracy",), _splits("SST-2.tsv")),
        Spec("mrpc", "MRPC", ("#1 String", "#2 String"), "Quality", PAIR,
             ("not_equivalent", "equivalent"), BINARY, ("f1", "accuracy"),
             _splits("MRPC.tsv")),
        Spec("stsb", "STS-B", PAIR, "score", PAIR, None, None, ("pearson", "spearman"),
             _splits("STS-B.tsv")),
        Spec("qqp", "QQP", ("question1", "question2"), "is_duplicate",
             ("question1", "question2"), ("not_duplicate", "duplicate"), BINARY,
             ("f1", "accuracy"), _splits("QQP.tsv"), tsv_index="id"),
        Spec("mnli", "MNLI", PAIR, "gold_label", ("premise", "hypothesis"), ENTAILMENT_3,
             ENTAILMENT_3, ("accuracy",), {
                 "train": Split("train"),
                 "validation_matched": Split("dev_matched"),
                 "validation_mismatched": Split("dev_mismatched"),
                 "test_matched": Split("test_matched", False, "MNLI-m.tsv"),
                 "test_mismatched": Split("test_mismatched", False, "MNLI-mm.tsv")}),
        Spec("qnli", "QNLI", ("question", "sentence"), "label", ("question", "sentence"),
             ENTAILMENT_2, ENTAILMENT_2, ("accuracy",), _splits("QNLI.tsv")),
        Spec("rte", "RTE", PAIR, "label", PAIR, ENTAILMENT_2, ENTAILMENT_2, ("accuracy",),
             _splits("RTE.tsv")),
        Spec("wnli", "WNLI", PAIR, "label", PAIR, ("not_entailment", "entailment"), BINARY,
             ("accuracy",), _splits("WNLI.tsv")),
        # The diagnostic set: test only, predicted by the MNLI model.
        Spec("ax", "diagnostic", PAIR, "", ("premise", "hypothesis"), ENTAILMENT_3,
             ENTAILMENT_3, ("accuracy",),
             {"test": Split("diagnostic", labelled=False, submission="AX.tsv")}),
    )
}  # fmt: skip
# The tasks that are trained (AX is predicted by MNLI's model), in the GLUE leaderboard's order.
TRAINED = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
