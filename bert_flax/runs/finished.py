"""A run's final metrics (`FINAL_METRICS`, `FinalMetrics`): written at its end (`write_final`),
read back when it ended on its own (`ended_run`), and reused by a driver when it is the same run
(`reusable_run`; a workdir of another run is moved aside, `set_aside`).

    task = tasks.task_class(config.task)(config)
    final = finished.reusable_run(workdir, config, task) or loop.train_and_evaluate(
        config, workdir, task=task
    )
"""

import json
import os
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import ml_collections
from absl import logging

from bert_flax.runs import fingerprint

if TYPE_CHECKING:
    from bert_flax.tasks import Task

FINAL_METRICS = "final_metrics.json"

# No `from __future__ import annotations` here: it would hide `NotRequired` from TypedDict.


class FinalMetrics(TypedDict):
    """What `train_and_evaluate` returns and writes to `FINAL_METRICS`."""

    step: int  # the last step
    steps_this_run: int  # since this process resumed or started
    seconds_this_run: float
    preempted: bool  # stopped by SIGTERM or JAX's preemption notice (a rerun resumes)
    target_reached: bool  # `config.eval.stop_at`
    sequences_seen: float  # over the whole run, every restart included
    train_seconds: float  # wall-clock seconds in training steps, over the whole run
    compile_seconds: float  # compiling the train step, once per process
    baseline: float  # the task's trivial predictor's score on the eval set
    baseline_name: str
    train: dict[str, float]  # the last train summary
    eval: dict[str, float]  # the last eval summary
    best: dict[str, Any]  # the best parameters' record (`parameters.BestParams.record`)
    setup: dict[str, Any]  # what the setup resolved (config.json's "resolved")
    test: NotRequired[dict[str, Any]]  # a fine-tuning task's test split (`Task.predict_test`)
    submissions: NotRequired[dict[str, int]]  # GLUE's submission files: their rows
    reused: NotRequired[bool]  # returned by `reusable_run`, never written


def write_final(final: FinalMetrics, workdir: str) -> None:
    with open(os.path.join(workdir, FINAL_METRICS), "w") as f:
        json.dump(final, f, indent=2, default=float)


def ended_run(workdir: str) -> FinalMetrics | None:
    """The final metrics of the run in `workdir` if it ended on its own (its steps, its clock or
    its eval target), else None (never started, or interrupted: training it again resumes it);
    whichever config, data or code made it (`reusable_run` checks that)."""
    path = os.path.join(workdir, FINAL_METRICS)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        final = json.load(f)
    return None if final["preempted"] else final


def reusable_run(
    workdir: str, config: ml_collections.ConfigDict, task: "Task"
) -> FinalMetrics | None:
    """The final metrics of the run in `workdir`, marked `"reused": True`, if it ended on its own
    (`ended_run`) and is the same run: its fingerprint (`fingerprint`: config, data, code) is that
    of `config` and `task` (the config's: `task_class(config.task)(config)`). Else None, for the
    caller to train: no run there, or an interrupted one of the same fingerprint (training
    resumes it). A run of another fingerprint, finished or not, is moved aside (`set_aside`) with
    a warning naming what differs. For drivers that must not train a finished run further (a
    rerun would give it a new clock) nor reuse one that other config, data or code made."""
    if not os.path.isdir(workdir) or not os.listdir(workdir):
        return None
    expected = fingerprint.of_run(config, task)
    differs = fingerprint.differences(fingerprint.load(workdir), expected)
    if differs:
        stale = set_aside(workdir)
        logging.warning(
            "%s held another run (%s): moved it to %s; training afresh.",
            workdir,
            "; ".join(differs),
            stale,
        )
        return None
    final = ended_run(workdir)
    return final and {**final, "reused": True}


def set_aside(workdir: str) -> str:
    """Renames `workdir` to the first free `<workdir>.stale-N` (never deletes); returns it."""
    n = 1
    while os.path.exists(f"{workdir}.stale-{n}"):
        n += 1
    os.rename(workdir, f"{workdir}.stale-{n}")
    return f"{workdir}.stale-{n}"
