"""Sequence classification and regression of single texts or sentence pairs: its files, read and
checked (`reading.py`), its labelled data (`data.py`), head and loss (`model.py`), task
(`task.py`) and packed inference (`predict.py`)."""

from bert_flax.tasks.classification.task import ClassificationTask

__all__ = ["ClassificationTask"]
