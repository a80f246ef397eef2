"""Tasks: what a training run does with its data. One train loop, setup, train step, optimizer
stack, mesh and checkpointing serve them all (`bert_flax.train.loop`); a task contributes the model,
its objective, its batches and how to judge an evaluation.

    task = TASKS[config.task](config)              # "pretraining" (bert_flax.train), a fine-tuning
    final = train.train_and_evaluate(config, workdir, task=task)   # task (bert_flax.finetune)

A task is one folder holding what it owns: its data reading, head and objective, task class,
evaluation and prediction output (`classification/`, `glue/`, `multi_label/`, `squad/`,
`token_classification/`; pre-training's data pipeline is `bert_flax.data`). A new task
subclasses `Task` (`base.py`; `FineTuningTask` for one trained in epochs over a table of
examples) and registers here (docs/design.md, "Adding a task").
"""

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


def task_class(name: str) -> type[Task]:
    """The registered task `name` (`config.task`)."""
    if name not in TASKS:
        raise ValueError(f"config.task={name!r} is not one of {sorted(TASKS)}.")
    return TASKS[name]


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
    "task_class",
]
