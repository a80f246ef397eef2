"""Tasks: what a training run does with its data. One train loop, setup, train step, optimizer
stack, mesh and checkpointing serve them all (`bert_flax.train`); a task contributes the model,
its objective, its batches and how to judge an evaluation.

    task = PreTrainingTask(config)                 # bert_flax.main (the default)
    task = ClassificationTask(config)              # bert_flax.finetune
    final = train.train_and_evaluate(config, workdir, task=task)

A new task subclasses `Task` (`base.py`); `pretraining.py` and `classification.py` are the two
worked examples, each with its own batches.
"""

from bert_flax.tasks.base import Batch, Task, model_config_from
from bert_flax.tasks.classification import ClassificationTask
from bert_flax.tasks.pretraining import PreTrainingTask

__all__ = ["Batch", "ClassificationTask", "PreTrainingTask", "Task", "model_config_from"]
