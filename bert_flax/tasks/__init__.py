"""Tasks: what a training run does with its data. One train loop, setup, train step, optimizer
stack, mesh and checkpointing serve them all (`bert_flax.train.loop`); a task contributes the model,
its objective, its batches and how to judge an evaluation.

    task = task_class(config.task)(config)         # "pretraining" or a fine-tuning task
    final = train.train_and_evaluate(config, workdir, task=task)   # python -m bert_flax.train

A task is one folder holding what it owns: its data reading, head and objective, task class,
evaluation and prediction output (`classification/`, `glue/`, `multi_label/`, `squad/`,
`token_classification/`; pre-training's data pipeline is `bert_flax.data`). A new task
subclasses `Task` (`base.py`; `FineTuningTask` for one trained in epochs over a table of
examples) and registers here (docs/design.md, "Adding a task").
"""

import json
import os

from bert_flax.tasks.base import Batch, Task, model_config_from
from bert_flax.tasks.classification import ClassificationTask
from bert_flax.tasks.finetuning import FineTuningTask
from bert_flax.tasks.glue import GlueTask
from bert_flax.tasks.multi_label import MultiLabelTask
from bert_flax.tasks.pretraining import PreTrainingTask
from bert_flax.tasks.squad import SquadTask
from bert_flax.tasks.token_classification import TokenClassificationTask

TASKS: dict[str, type[Task]] = {
    task.name: task
    for task in (
        PreTrainingTask,
        ClassificationTask,
        GlueTask,
        MultiLabelTask,
        SquadTask,
        TokenClassificationTask,
    )
}


# The task of a run's config.json from before `config.task` (fine-tuning was classification only).
LEGACY_TASK = "classification"


def task_class(name: str) -> type[Task]:
    """The registered task `name` (`config.task`)."""
    if name not in TASKS:
        raise ValueError(f"config.task={name!r} is not one of {sorted(TASKS)}.")
    return TASKS[name]


def run_task(workdir: str) -> str:
    """The task the run in `workdir` trained (its config.json's `task`)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {workdir!r} is not a fine-tuning run.")
    with open(path) as f:
        return json.load(f).get("task", LEGACY_TASK)


__all__ = [
    "TASKS",
    "Batch",
    "ClassificationTask",
    "FineTuningTask",
    "GlueTask",
    "MultiLabelTask",
    "PreTrainingTask",
    "SquadTask",
    "Task",
    "TokenClassificationTask",
    "model_config_from",
    "run_task",
    "task_class",
]
