"""Token classification (NER, POS, chunking): CoNLL files and the TFDS builder (`reading.py`),
label schemes and entity scores (`metrics.py`), packed rows of sentences (`rows.py`), the head
and loss (`model.py`), packed inference and CoNLL output (`predict.py`), the task (`task.py`)
and the bundled rule-tagged set (`rule_set.py`); docs/training.md, "Token classification"."""

from bert_flax.tasks.token_classification.task import TokenClassificationTask

__all__ = ["TokenClassificationTask"]
