"""GLUE: the nine tasks and the diagnostic set in one table (`table.py`), read from the GLUE
download, TFDS or the Hugging Face export (`reading.py`), fine-tuned as classification
(`task.py`), with the GLUE server's submission files (`submission.py`)."""

from bert_flax.tasks.glue.table import GLUE, TRAINED, Spec
from bert_flax.tasks.glue.task import GlueTask

__all__ = ["GLUE", "TRAINED", "GlueTask", "Spec"]
