r"""Fine-tuning and packed inference for every fine-tuning task (`config.task`): sequence
classification or regression of texts or pairs, extractive question answering (SQuAD), and
token classification (NER, POS, chunking).

  python -m bert_flax.finetune --config=configs/finetune_sentiment.py --workdir=workdir/sst \
      [--config.init_from=workdir/pretrain]        # a pre-training run, HF or bert_flax dir
  python -m bert_flax.finetune --workdir=workdir/sst --predict=reviews.csv \
      --output=predictions.jsonl                  # packed inference with the best parameters
  python -m bert_flax.finetune --config=configs/squad.py --workdir=workdir/squad \
      --config.data.train_file=train-v1.1.json --config.data.validation_file=dev-v1.1.json
  python -m bert_flax.finetune --workdir=workdir/squad --predict=dev-v1.1.json  # predictions.json
  python -m bert_flax.finetune --config=configs/glue.py:rte --workdir=workdir/rte \
      --config.data.glue_dir=glue_data            # a GLUE task; then RTE.tsv, its submission
  python -m bert_flax.finetune --config=configs/conll.py --workdir=workdir/rule_ner
  python -m bert_flax.finetune --workdir=workdir/rule_ner --predict=eng.testb  # eng.testb.predicted

Training is `bert_flax.train.loop.train_and_evaluate` with the config's task: the same train step,
optimizers, mesh, checkpointing and preemption handling as pre-training. Epochs become steps
(`resolve_epochs`), evaluation runs every epoch on the validation split, and the best
parameters (by the task's metric: `config.eval.metric` of a classifier's metrics, computed
over the whole validation split, accuracy or MSE by default; F1 for SQuAD; entity F1 for token
classification) are kept in `workdir/best`. After training, the best parameters predict the test
split, if any (`workdir/predictions_test.jsonl`, `.txt` for token classification).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from bert_flax import errors, sharding
from bert_flax.tasks import FineTuningTask, task_class
from bert_flax.train import loop, overrides
from bert_flax.train.setup import adjust_for_packing

DEFAULT_TASK = "classification"  # configs (and runs) from before `config.task`


def resolve_epochs(config: ml_collections.ConfigDict, task: FineTuningTask) -> None:
    """Sets `train.steps` (= `train.epochs` x steps per epoch, at least `train.min_steps`), and
    `eval.every_steps` and `checkpoint.every_steps` to one epoch (or, with `eval.evaluations`,
    to that many evaluations over the run), for the rows per step after the packing adjustment."""
    mesh = sharding.mesh_of(config.mesh)
    adjustment = adjust_for_packing(
        config, task.packing_factor(), sharding.data_parallel_size(mesh)
    )
    per_epoch = task.steps_per_epoch(adjustment.batch_size)
    if per_epoch == 0:
        raise ValueError(
            f"The train split makes fewer rows than one step's {adjustment.batch_size}; lower "
            "config.train.batch_size."
        )
    config.train.steps = max(math.ceil(config.train.epochs * per_epoch), config.train.min_steps)
    evaluations = config.eval.evaluations
    every = math.ceil(config.train.steps / evaluations) if evaluations else per_epoch
    config.eval.every_steps = config.checkpoint.every_steps = every
    warmup_fraction = config.schedule.get("warmup_fraction", 0.0)
    if warmup_fraction:
        config.schedule.warmup_steps = round(warmup_fraction * config.train.steps)


def finetune(
    config: ml_collections.ConfigDict, workdir: str, task: FineTuningTask | None = None
) -> dict[str, Any]:
    """Fine-tunes (`task`: default the config's, built here), then predicts the test split(s)
    (if the task has them: `predict_test`) with the best parameters."""
    task = task or task_class(config.get("task", DEFAULT_TASK))(config)
    resolve_epochs(config, task)
    final = loop.train_and_evaluate(config, workdir, task=task)
    if jax.process_index() == 0 and not final["preempted"]:
        final.update(task.predict_test(workdir))
        if "test" in final:
            logging.info("Test %s", json.dumps(final["test"]))
    return final


FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line's flags (defined only when this module runs as the program)."""
    config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.")
    flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, best/).")
    flags.DEFINE_string(
        "predict",
        None,
        "Instead of training: a file for the workdir's best parameters (classification: "
        "CSV/TSV/JSONL with text[, text_b]; squad: a SQuAD JSON file; token_classification: "
        "a CoNLL file).",
    )
    flags.DEFINE_string("output", None, "Where --predict writes (default beside the input file).")
    flags.DEFINE_float(
        "null_threshold",
        None,
        "SQuAD v2.0: answer no-answer where its margin exceeds this (default: the threshold "
        "of the best evaluation).",
    )
    flags.mark_flag_as_required("workdir")


def run_task(workdir: str) -> str:
    """The task a fine-tuning run in `workdir` trained (its config.json's `task`)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {workdir!r} is not a fine-tuning run.")
    with open(path) as f:
        return json.load(f).get("task", DEFAULT_TASK)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.predict:
        options = {} if FLAGS.null_threshold is None else {"null_threshold": FLAGS.null_threshold}
        predict_file = task_class(run_task(FLAGS.workdir)).predict_file
        print(predict_file(FLAGS.workdir, FLAGS.predict, FLAGS.output, **options))
        return
    if FLAGS.config is None:
        raise app.UsageError("--config is required to train (or --predict=FILE to predict).")
    final = finetune(FLAGS.config, FLAGS.workdir)
    loop.exit_if_preempted(final)
    best = final.get("best") or {}
    print(
        f"best validation {best.get('metric')} {best.get('value', float('nan')):.4f} at step "
        f"{best.get('step')} ({final['baseline_name']}: {final['baseline']:.4f})"
    )
    for name in ("test", "submissions"):  # a classifier's test split; GLUE's submission files
        if name in final:
            print(f"{name}: {json.dumps(final[name])}")


if __name__ == "__main__":
    define_flags()
    errors.run(main, flags_parser=overrides.flags_parser("config"))
