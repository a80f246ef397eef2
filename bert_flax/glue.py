r"""GLUE: one pre-trained BERT fine-tuned on each task of the benchmark over a small grid of
learning rates, the best dev run of each task kept, and the GLUE table.

  python -m bert_flax.glue --init_from=DIR --glue_dir=glue_data --workdir=workdir/glue \
      [--tasks=cola,rte] [--learning_rates=2e-5,3e-5] [--size=base] [--set=train.epochs=2]

Each (task, learning rate) is a fine-tuning run of `configs/glue.py:<task>,<size>` in
`WORKDIR/<task>/lr_<rate>` (a rerun resumes or reuses it), which ends with the task's submission
files from its best parameters. Per task the run with the best dev score (its main metric) wins;
its submission files are copied to `WORKDIR/submission/` (with AX.tsv from MNLI's model). The
table (per task its metrics and score, the mean of its metrics; MNLI's score is the mean of its
matched and mismatched accuracies; then the mean over the tasks, WNLI excluded as in BERT's
paper, and with it) is printed and written to `WORKDIR/glue.json` and `glue.md`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import flags, logging

from bert_flax import errors
from bert_flax.tasks.glue import GLUE, TRAINED, GlueTask
from bert_flax.train import loop, overrides
from configs import glue as glue_config

GRIDS = {"cpu": (1e-3, 3e-4), "base": (5e-5, 4e-5, 3e-5, 2e-5)}  # BERT's, for BERT-base
EXCLUDED = ("wnli",)  # left out of the headline mean, as BERT's paper does
RESULTS = "glue"  # WORKDIR/glue.json, glue.md
SUBMISSION_DIR = "submission"


def task_config(
    task: str, size: str, rate: float, glue_dir: str, init_from: str, settings: Sequence[str]
) -> ml_collections.ConfigDict:
    """`configs/glue.py:<task>,<size>` at learning rate `rate`, with `settings` (key=value)."""
    config = glue_config.get_config(f"{task},{size}")
    config.data.glue_dir, config.init_from = glue_dir, init_from
    config.schedule.learning_rate = rate
    for setting in settings:
        key, separator, value = setting.partition("=")
        if not separator:
            raise ValueError(f"--set={setting!r} is not key=value (e.g. train.epochs=2).")
        try:
            overrides.set_value(config, key, value)
        except KeyError as error:
            raise ValueError(f"--set={setting!r}: {error.args[0]}") from None
    return config


def dev_scores(task: str, evaluation: dict[str, float]) -> dict[str, float]:
    """The task's GLUE metrics of an evaluation (MNLI: matched, `-mm` mismatched) and `score`,
    their mean."""
    spec = GLUE[task]
    found = {name: evaluation[name] for name in spec.metrics}
    for split in spec.eval_splits[1:]:
        found.update({f"{name}-mm": evaluation[f"{name}_{split}"] for name in spec.metrics})
    return {**found, "score": float(np.mean(list(found.values())))}


def best_run(runs: dict[float, dict[str, Any]]) -> float:
    """The learning rate whose run scored best on dev (its main metric)."""
    return max(runs, key=lambda rate: runs[rate]["best"]["value"])


def run_task(task: GlueTask, rates: Sequence[float], workdir: str, **setup: Any) -> dict[str, Any]:
    """Fine-tunes `task` (its data read once) at each of `rates`; the best run's record, its
    submission files copied to `workdir/submission`."""
    runs, key = {}, task.spec.key
    for rate in rates:
        run_dir = os.path.join(workdir, key, f"lr_{rate:g}")
        logging.info("GLUE %s at learning rate %g: %s", key, rate, run_dir)
        config = task_config(key, rate=rate, **setup)
        runs[rate] = loop.train_and_evaluate(config, run_dir, task=task)
        runs[rate]["workdir"] = run_dir
    rate = best_run(runs)
    best = runs[rate]
    os.makedirs(os.path.join(workdir, SUBMISSION_DIR), exist_ok=True)
    for name in best.get("submissions", {}):
        shutil.copy(os.path.join(best["workdir"], name), os.path.join(workdir, SUBMISSION_DIR))
    return {
        "learning_rate": rate,
        "workdir": best["workdir"],
        "step": best["best"]["step"],
        "dev": dev_scores(key, best["best"]["eval"]),
        "grid": {f"{r:g}": runs[r]["best"]["value"] for r in rates},
        "submissions": sorted(best.get("submissions", {})),
    }


def table(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The per-task results with the means over tasks (WNLI excluded, and included)."""
    scores = {task: result["dev"]["score"] for task, result in results.items()}
    counted = [score for task, score in scores.items() if task not in EXCLUDED]
    return {
        "tasks": results,
        "score": float(np.mean(counted)) if counted else float("nan"),
        "score_with_wnli": float(np.mean(list(scores.values()))),
        "excluded": [task for task in EXCLUDED if task in scores],
    }


def markdown(summary: dict[str, Any]) -> str:
    """The GLUE table as markdown: a row per task, then the means."""
    lines = ["| task | learning rate | dev metrics | score |", "|---|---|---|---|"]
    for task, result in summary["tasks"].items():
        metrics = ", ".join(f"{k} {100 * v:.1f}" for k, v in result["dev"].items() if k != "score")
        lines.append(
            f"| {task} | {result['learning_rate']:g} | {metrics} | "
            f"{100 * result['dev']['score']:.1f} |"
        )
    with_wnli = (
        f"{100 * summary['score_with_wnli']:.1f} with it" if summary["excluded"] else "not run"
    )
    lines.append(
        f"\nGLUE dev score {100 * summary['score']:.1f}: the mean of the tasks' scores without "
        f"WNLI ({with_wnli})."
    )
    return "\n".join(lines) + "\n"


def read_tasks(keys: Sequence[str], **setup: Any) -> list[GlueTask]:
    """The GLUE tasks `keys`, their data read and checked (before any training)."""
    return [GlueTask(task_config(key, rate=1.0, **setup)) for key in keys]


def run_glue(
    tasks: Sequence[GlueTask], rates: Sequence[float], workdir: str, **setup: Any
) -> dict[str, Any]:
    """Every task of `tasks` over `rates`; writes and returns the table."""
    results = {task.spec.key: run_task(task, rates, workdir, **setup) for task in tasks}
    summary = table(results)
    with open(os.path.join(workdir, f"{RESULTS}.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(workdir, f"{RESULTS}.md"), "w") as f:
        f.write(markdown(summary))
    return summary


FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line's flags (defined only when this module runs as the program)."""
    flags.DEFINE_string("init_from", "", "The pre-trained model (any checkpoint kind).")
    flags.DEFINE_string("glue_dir", None, "The GLUE download's folder (CoLA/, SST-2/, ...).")
    flags.DEFINE_string("workdir", None, "Where the runs, table and submission files go.")
    flags.DEFINE_list("tasks", list(TRAINED), f"Tasks of {list(TRAINED)}.")
    flags.DEFINE_list("learning_rates", [], "The grid (default: the size's, GRIDS).")
    flags.DEFINE_enum("size", "cpu", list(GRIDS), "configs/glue.py's size.")
    flags.DEFINE_multi_string("set", [], "key=value: a config field of every run.")
    flags.mark_flags_as_required(["glue_dir", "workdir"])


def parse_rates(texts: Sequence[str], size: str) -> list[float]:
    """The learning rates of `--learning_rates` (default the size's grid), checked."""
    try:
        rates = [float(text) for text in texts] or list(GRIDS[size])
    except ValueError:
        raise ValueError(f"--learning_rates={','.join(texts)}: not numbers.") from None
    if min(rates) <= 0:
        raise ValueError(f"--learning_rates={','.join(texts)}: each must be positive.")
    return rates


def main(argv: list[str]) -> None:
    del argv
    unknown = [task for task in FLAGS.tasks if task not in TRAINED]
    if unknown:
        raise ValueError(f"--tasks: {unknown} are not GLUE tasks; choose from {list(TRAINED)}.")
    rates = parse_rates(FLAGS.learning_rates, FLAGS.size)
    setup = {"size": FLAGS.size, "glue_dir": FLAGS.glue_dir, "init_from": FLAGS.init_from}
    tasks = read_tasks(FLAGS.tasks, settings=FLAGS.set, **setup)  # bad input: before training
    errors.check_writable_dir(FLAGS.workdir)
    summary = run_glue(tasks, rates, FLAGS.workdir, settings=FLAGS.set, **setup)
    print(markdown(summary), end="")


if __name__ == "__main__":
    define_flags()
    errors.run(main)
