"""Multi-label classification: several labels per text (or sentence pair), one sigmoid per label
with binary cross-entropy, scored by micro and macro F1 at a threshold tuned on validation:
its data (`data.py`), loss and metrics (`model.py`, `metrics.py`) and task (`task.py`)."""

from bert_flax.tasks.multi_label.task import MultiLabelTask

__all__ = ["MultiLabelTask"]
