"""Packed QA inference: windows' logits out of packed rows, answers per question, the official
scores, and `predictions.json`.

    qa = QASet.build(read_squad("dev-v1.1.json"), vocab, WindowSettings())
    logits = infer(model_config, params, qa, max_sequences_per_pack=3)   # window -> logits
    found = predict_examples(qa, logits)            # question id -> Prediction
    scores(qa, found)                               # exact_match, f1 (and v2.0's threshold)

`bert_flax.train --predict=dev-v1.1.json --workdir=W` runs all of it with the best parameters.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh

from bert_flax.data import tokenization
from bert_flax.model.config import BertConfig
from bert_flax.runs import parameters
from bert_flax.tasks.inference import predict_rows
from bert_flax.tasks.squad import metrics
from bert_flax.tasks.squad.model import QA_INPUTS, BertForQuestionAnswering, eval_outputs
from bert_flax.tasks.squad.predictions import Prediction, answer_text, best_null_threshold
from bert_flax.tasks.squad.predictions import predict as predict_example
from bert_flax.tasks.squad.reading import Example, Window, read_squad, to_windows
from bert_flax.tasks.squad.rows import WindowTable

PREDICTIONS_FILE = "predictions.json"


@dataclasses.dataclass(frozen=True)
class WindowSettings:
    """How questions become windows, and how answers are read off logits (`run_squad.py`'s
    flags of the same names)."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    n_best: int = 20
    max_answer_length: int = 30


@dataclasses.dataclass
class QASet:
    """A SQuAD file's questions, their windows (in question order) and the rows' table."""

    examples: list[Example]
    windows: list[Window]
    settings: WindowSettings

    @classmethod
    def build(cls, examples: Sequence[Example], vocab, settings: WindowSettings) -> QASet:
        if not examples:
            raise ValueError("There are no questions to make windows of.")
        windows = [
            window
            for example in examples
            for window in to_windows(
                example,
                vocab,
                settings.max_seq_length,
                settings.doc_stride,
                settings.max_query_length,
            )
        ]
        return cls(list(examples), windows, settings)

    @property
    def table(self) -> WindowTable:
        return WindowTable(self.windows)

    @property
    def version_2(self) -> bool:
        """Whether any question is unanswerable (a v2.0 set)."""
        return any(e.is_impossible for e in self.examples)

    def golds(self) -> list[tuple[str, list[str]]]:
        return [(e.id, [a.text for a in e.answers]) for e in self.examples]


def window_logits(
    outputs: Iterable[Mapping[str, np.ndarray]], lengths: np.ndarray
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Window index -> its (start, end) logits over its own tokens, read out of packed rows:
    each batch's `start_logits` / `end_logits` [B, L] at the slots' `window_ids` and
    `cls_positions` [B, D] (`model.eval_outputs`)."""
    found = {}
    for out in outputs:
        for row, slot in zip(*np.nonzero(out["window_ids"] >= 0)):
            window = int(out["window_ids"][row, slot])
            first = int(out["cls_positions"][row, slot])
            span = slice(first, first + int(lengths[window]))
            found[window] = (out["start_logits"][row, span], out["end_logits"][row, span])
    return found


def predict_examples(
    qa: QASet, logits: Mapping[int, tuple[np.ndarray, np.ndarray]]
) -> dict[str, Prediction]:
    """Question id -> its best answer over its windows."""
    if len(logits) != len(qa.windows):
        raise RuntimeError(
            f"{len(qa.windows) - len(logits)} of {len(qa.windows)} windows got no logits; the "
            "packer lost them."
        )
    found, first = {}, 0
    for example, windows in itertools.groupby(qa.windows, key=lambda w: w.example_id):
        windows = list(windows)
        indices = range(first, first + len(windows))
        first += len(windows)
        found[example] = predict_example(
            qa.examples[len(found)],
            windows,
            [logits[i][0] for i in indices],
            [logits[i][1] for i in indices],
            n_best=qa.settings.n_best,
            max_answer_length=qa.settings.max_answer_length,
        )
    return found


def scores(
    qa: QASet, found: Mapping[str, Prediction], null_threshold: float | None = None
) -> dict[str, float]:
    """Exact match and F1 (percent) of `found` on `qa`. On a v2.0 set, with the null-margin
    threshold that maximises exact match (the official script's "best" scores; `null_threshold`
    overrides it), reported as `null_threshold`."""
    golds = qa.golds()
    if not qa.version_2:
        answers = {q: p.text for q, p in found.items()}
        return _scores(golds, answers)
    if null_threshold is None:
        exact = {q: metrics.best_over_golds(metrics.exact_match, found[q].text, g)
                 for q, g in golds}  # fmt: skip
        has_answer = {e.id: not e.is_impossible for e in qa.examples}
        null_threshold = best_null_threshold(dict(found), has_answer, exact)
    answers = {q: answer_text(p, null_threshold) for q, p in found.items()}
    return {**_scores(golds, answers), "null_threshold": float(null_threshold)}


def _scores(golds, answers) -> dict[str, float]:
    result = metrics.evaluate(golds, answers)
    return {"exact_match": result.exact_match, "f1": result.f1}


def infer(
    model_config: BertConfig,
    params: Any,
    qa: QASet,
    *,
    max_sequences_per_pack: int,
    rows: int = 32,
    packed: bool = True,
    algorithm: str = "lpfhp",
    mesh: Mesh | None = None,
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every window's (start, end) logits, from packed rows (unless not `packed`) on `mesh`
    (default: every device, data parallel)."""
    table = qa.table
    batches = predict_rows(
        BertForQuestionAnswering(model_config),
        params,
        table,
        inputs=QA_INPUTS,
        outputs=lambda out: out,
        max_seq_length=qa.settings.max_seq_length,
        max_sequences_per_pack=max_sequences_per_pack,
        packed=packed,
        algorithm=algorithm,
        rows=rows,
        mesh=mesh,
    )
    outputs = [eval_outputs(out, batch) for batch, out in batches]
    return window_logits(outputs, table.lengths)


def write_predictions(path: str, answers: Mapping[str, str]) -> None:
    """`predictions.json`: question id -> answer text (what the official scripts read)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(dict(answers), f, ensure_ascii=False, indent=1)


def predict_file(
    workdir: str, path: str, output: str | None, null_threshold: float | None = None
) -> str:
    """Answers every question of the SQuAD file `path` with the workdir's best parameters, into
    `predictions.json` at `output` (default beside `path`). A v2.0 model answers "" where the
    no-answer margin exceeds `null_threshold` (default: the one its best evaluation chose).
    Returns a one-line summary, with its EM/F1 against the file's answers."""
    model_config, params, head = parameters.load_finetuned(workdir)
    lowercase = head.get("lowercase", True)  # models fine-tuned before it was recorded: uncased
    vocab = tokenization.load_vocab(head.get("vocab_file") or None, lowercase=lowercase)
    settings = WindowSettings(**head["windows"])
    qa = QASet.build(read_squad(path), vocab, settings)
    logits = infer(
        model_config,
        params,
        qa,
        max_sequences_per_pack=head["max_sequences_per_pack"],
        algorithm=head["algorithm"],
    )
    found = predict_examples(qa, logits)
    if head["version_2"] and null_threshold is None:
        null_threshold = head.get("eval", {}).get("null_threshold", 0.0)
    threshold = null_threshold if head["version_2"] else None
    output = output or os.path.join(os.path.dirname(os.path.abspath(path)), PREDICTIONS_FILE)
    write_predictions(output, {q: answer_text(p, threshold) for q, p in found.items()})
    figures = scores(qa, found, threshold)
    return (
        f"{len(found)} answers ({len(qa.windows)} windows) -> {output} | exact_match "
        f"{figures['exact_match']:.2f} f1 {figures['f1']:.2f}"
    )
