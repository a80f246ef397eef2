"""A tiny GLUE download written as download_glue_data.py lays it out (CoLA's train and dev
without a header, quotes left unescaped, MNLI's parse columns), for the GLUE tests."""

from __future__ import annotations

import os

import numpy as np
import pytest

WORDS = "the a film cat sat on mat it was good bad \" very not quite so ( ) , . 's".split()
MNLI_FRONT = "index promptID pairID genre sentence1_binary_parse sentence2_binary_parse "
MNLI_FRONT += "sentence1_parse sentence2_parse sentence1 sentence2"
PAIR = "index sentence1 sentence2"
STSB = "index genre filename year old_index source1 source2 sentence1 sentence2"


def _layout(train: str, test: str, label: str | None) -> tuple:
    return (train.split(" ") if train else None, test.split(" "), label)


# Per folder: (train/dev columns, test columns, the label column). None: CoLA's headerless files.
# Columns are separated by spaces here (MRPC's "#1 ID" written "#1_ID").
LAYOUTS = {
    "CoLA": _layout("", "index sentence", None),
    "SST-2": _layout("sentence label", "index sentence", "label"),
    "MRPC": _layout("Quality #1_ID #2_ID #1_String #2_String",
                    "index #1_ID #2_ID #1_String #2_String", "Quality"),
    "STS-B": _layout(STSB + " score", STSB, "score"),
    "QQP": _layout("id qid1 qid2 question1 question2 is_duplicate", "id question1 question2",
                   "is_duplicate"),
    "MNLI": _layout(MNLI_FRONT + " label1 gold_label", MNLI_FRONT, "gold_label"),
    "QNLI": _layout("index question sentence label", "index question sentence", "label"),
    "RTE": _layout(PAIR + " label", PAIR, "label"),
    "WNLI": _layout(PAIR + " label", PAIR, "label"),
}  # fmt: skip
LABELS = {
    "CoLA": ["0", "1"], "SST-2": ["0", "1"], "MRPC": ["0", "1"], "QQP": ["0", "1"],
    "WNLI": ["0", "1"], "MNLI": ["entailment", "neutral", "contradiction"],
    "QNLI": ["entailment", "not_entailment"], "RTE": ["entailment", "not_entailment"],
}  # fmt: skip
FILES = {"MNLI": ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched")}


def sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(2, 9))))


def cell(column: str, row: int, label: str, rng: np.random.Generator) -> str:
    """A value of `column` in the row `row` whose label is `label`."""
    if column in ("index", "id", "promptID", "pairID", "qid1", "qid2", "old_index", "year"):
        return str(row * 3 + 1)  # not the row's position: the files' own index
    if column in ("label", "Quality", "is_duplicate", "gold_label", "label1", "score"):
        return label
    if column in ("genre", "filename", "source1", "source2", "#1_ID", "#2_ID"):
        return "x"
    return sentence(rng)


def write_glue_dir(root: str, rows: int = 24, seed: int = 0) -> str:
    """The GLUE folder under `root`: every task's files with `rows` rows each."""
    rng = np.random.default_rng(seed)
    for folder, (columns, test_columns, _) in LAYOUTS.items():
        os.makedirs(os.path.join(root, folder))
        for name in FILES.get(folder, ("train", "dev", "test")):
            test = name.startswith("test")
            lines = []
            for row in range(rows):
                label = (
                    f"{rng.uniform(0, 5):.3f}"
                    if folder == "STS-B"
                    else LABELS[folder][row % len(LABELS[folder])]
                )
                if folder == "CoLA" and not test:
                    lines.append(f"gj04\t{label}\t{'' if label == '1' else '*'}\t{sentence(rng)}")
                else:
                    header = test_columns if test else columns
                    lines.append("\t".join(cell(c, row, label, rng) for c in header))
            if test or columns:
                header = "\t".join(test_columns if test else columns)
                lines.insert(0, header.replace("_ID", " ID").replace("_String", " String"))
            with open(os.path.join(root, folder, f"{name}.tsv"), "w") as f:
                f.write("\n".join(lines) + "\n")
    os.makedirs(os.path.join(root, "diagnostic"))
    with open(os.path.join(root, "diagnostic", "diagnostic.tsv"), "w") as f:
        f.write("index\tsentence1\tsentence2\n")
        f.writelines(f"{i}\t{sentence(rng)}\t{sentence(rng)}\n" for i in range(rows))
    return root


@pytest.fixture(scope="session")
def glue_dir(tmp_path_factory) -> str:
    return write_glue_dir(str(tmp_path_factory.mktemp("glue_data")))
