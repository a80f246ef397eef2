"""`SquadTask`: fine-tuning `BertForQuestionAnswering` on a SQuAD v1.1 or v2.0 file (or the
bundled cloze set), several (question, window) sequences a row, judged by the official exact
match and F1 over whole questions (`score_outputs`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import ml_collections
import numpy as np

from bert_flax.data import corpus
from bert_flax.input_pipeline import contract
from bert_flax.model import losses
from bert_flax.model.config import BertConfig
from bert_flax.tasks.base import Batch, data_identity, model_config_from
from bert_flax.tasks.finetuning import FineTuningTask, task_vocab
from bert_flax.tasks.squad import cloze, metrics, predict
from bert_flax.tasks.squad.model import QA, BertForQuestionAnswering
from bert_flax.tasks.squad.reading import Example, read_squad
from bert_flax.tasks.squad.rows import QA_TASK_FEATURES

SPLITS = ("train", "validation")


@functools.cache
def bundled_cloze(seed: int) -> dict[str, tuple[Example, ...]]:
    """The cloze set of the bundled speeches by split (built once a process: about 10 s)."""
    documents = corpus.split_documents(
        corpus.read_documents(corpus.bundled_corpus_dir()), cloze.VALIDATION_FRACTION
    )
    return {split: tuple(cloze.examples(documents[split], seed=seed)) for split in SPLITS}


def squad_examples(config: ml_collections.ConfigDict) -> tuple[dict[str, list[Example]], str]:
    """({"train": ..., "validation": ...}, where they came from): `config.data.train_file` and
    `validation_file` (SQuAD JSON), or the cloze set built from the bundled speeches
    (`config.data.dataset = "cloze"`); `train_examples` (`validation_examples`) > 0 keeps
    only that many questions of the split (the first, in file order)."""
    data = config.data
    if data.train_file:
        if not data.validation_file:
            raise ValueError(
                "config.data.validation_file is empty: give the SQuAD file to evaluate on "
                "(e.g. dev-v1.1.json) beside config.data.train_file."
            )
        files = {"train": data.train_file, "validation": data.validation_file}
        examples = {split: read_squad(path) for split, path in files.items()}
        source = ", ".join(f"{split}: {path}" for split, path in files.items())
    elif data.dataset == "cloze":
        examples = {split: list(e) for split, e in bundled_cloze(data.split_seed).items()}
        source = f"the cloze set of the bundled speeches (seed {data.split_seed})"
    else:
        raise ValueError(
            f"config.data.dataset={data.dataset!r}: the bundled set is 'cloze'; for SQuAD set "
            "config.data.train_file and validation_file (v1.1 or v2.0 JSON)."
        )
    for split in SPLITS:
        count = data.get(f"{split}_examples", 0)
        examples[split] = examples[split][:count] if count else examples[split]
    return examples, source


class SquadTask(FineTuningTask):
    """Extractive question answering on packed (question, window) rows."""

    name = "squad"
    eval_metric = "f1"
    eval_metrics_shown = ("exact_match", "qa_loss")
    train_metrics_shown = ("qa_loss", "start_accuracy")
    predict_file = staticmethod(predict.predict_file)

    def __init__(self, config: ml_collections.ConfigDict):
        super().__init__(config)
        examples, self.source = squad_examples(config)
        self.vocab = task_vocab(config)
        self.settings = predict.WindowSettings(
            max_seq_length=config.data.max_seq_length,
            doc_stride=config.data.doc_stride,
            max_query_length=config.data.max_query_length,
            n_best=config.squad.n_best,
            max_answer_length=config.squad.max_answer_length,
        )
        self.sets = {
            split: predict.QASet.build(examples[split], self.vocab, self.settings)
            for split in SPLITS
        }
        self.encoded = {split: qa.table for split, qa in self.sets.items()}
        self.version_2 = any(qa.version_2 for qa in self.sets.values())

    @property
    def objective(self) -> losses.Objective:
        return QA

    def model(self, model_config: BertConfig) -> nn.Module:
        return BertForQuestionAnswering(model_config)

    def model_config(self) -> BertConfig:
        length = self.config.data.max_seq_length
        return model_config_from(self.config, length, self.vocab.size, "the tokenizer")

    def score_outputs(self, outputs: list[dict[str, np.ndarray]]) -> dict[str, float]:
        qa = self.sets[self.config.eval.split]
        found = predict.predict_examples(qa, predict.window_logits(outputs, qa.table.lengths))
        return predict.scores(qa, found)

    def baseline(self, eval_set: list[Batch]) -> tuple[str, float]:
        qa = self.sets[self.config.eval.split]
        first = {
            e.id: next((m.group() for m in cloze.mentions(e.context)), "") for e in qa.examples
        }
        return "the context's first name or number", metrics.evaluate(qa.golds(), first).f1

    def identity(self) -> str:
        summary = {
            "source": self.source,
            "questions": {split: len(qa.examples) for split, qa in self.sets.items()},
            "windows": dataclasses.asdict(self.settings),
            "vocab_size": self.vocab.size,
        }
        return data_identity("squad", summary, lowercase=self.vocab.lowercase)

    def check_batch(self, batch: Batch, model_config: BertConfig, *, evaluation: bool) -> None:
        contract.check_batch(batch, model_config, features=contract.CORE_FEATURES)
        missing = [name for name in QA_TASK_FEATURES if name not in batch]
        if missing:
            raise ValueError(f"A QA batch lacks {missing} (tasks/squad/rows.py).")
        length = batch["input_ids"].shape[1]
        for name in ("start_positions", "end_positions"):
            if batch[name].shape != batch["cls_positions"].shape:
                raise ValueError(f"{name} has shape {batch[name].shape}, not [batch, slots].")
            if batch[name].min() < 0 or batch[name].max() >= length:
                raise ValueError(f"{name} points outside the row of {length} tokens.")

    def pretrained_params(self, pretraining_params: Any, params: Any) -> Any:
        if "qa_outputs" in pretraining_params:  # already a QA model (another fine-tuning run)
            return pretraining_params
        return {**params, "bert": pretraining_params["bert"]}

    def head_config(self) -> dict[str, Any]:
        return {
            "windows": dataclasses.asdict(self.settings),
            "version_2": self.version_2,
            "max_sequences_per_pack": self.depth,
            "algorithm": self.config.data.algorithm,
            "vocab_file": self.vocab.path,
            "lowercase": self.vocab.lowercase,
        }

    def plot(self, workdir: str) -> list[str]:
        from bert_flax.runs import plots

        return [plots.plot_finetuning(workdir, self.eval_metric, loss="qa_loss")]

    def describe(self) -> dict[str, Any]:
        return {
            "data": self.source,
            "questions": {split: len(qa.examples) for split, qa in self.sets.items()},
            "windows": {split: len(qa.windows) for split, qa in self.sets.items()},
            "version_2": self.version_2,
            "max_seq_length": self.config.data.max_seq_length,
            "max_sequences_per_row": self.depth,
        }
