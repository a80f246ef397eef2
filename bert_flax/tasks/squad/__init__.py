"""Extractive question answering (SQuAD v1.1 / v2.0): the files and their windows
(`reading.py`), packed rows (`rows.py`), the head and loss (`model.py`), answers from logits
(`predictions.py`), the official exact-match and F1 scores (`metrics.py`), packed inference and
`predictions.json` (`predict.py`), the task (`task.py`) and the bundled cloze set (`cloze.py`);
docs/training.md, "Question answering (SQuAD)"."""

from bert_flax.tasks.squad.task import SquadTask

__all__ = ["SquadTask"]
