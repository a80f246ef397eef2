r"""Train any task (`config.task`: pre-training, or a fine-tuning task of `bert_flax.tasks.TASKS`)
from a config file, or predict a file with a fine-tuned run's best parameters:

  python -m bert_flax.train --config=configs/tiny.py --workdir=workdir/tiny \
      --config.data.data_dir=workdir/sotu_128 [--config.train.steps=100 ...]
  python -m bert_flax.train --config=configs/finetune_sentiment.py --workdir=workdir/sst \
      [--config.init_from=workdir/pretrain]        # a pre-training run, HF or bert_flax dir
  python -m bert_flax.train --workdir=workdir/sst --predict=reviews.csv \
      --output=predictions.jsonl                  # packed inference with the best parameters
  python -m bert_flax.train --config=configs/squad.py --workdir=workdir/squad \
      --config.data.train_file=train-v1.1.json --config.data.validation_file=dev-v1.1.json
  python -m bert_flax.train --workdir=workdir/squad --predict=dev-v1.1.json  # predictions.json

Any field of the config can be set with `--config.FIELD=VALUE` (e.g. `--config.model.num_layers=4`,
`--config.optimizer.name=shampoo --config.optimizer.shampoo.asynchronous=True`); an unknown
field is an error naming the valid ones (every field: configs/default.py).

A fine-tuning task trains in epochs (`train.epochs`): the steps, warm-up and evaluation interval
are derived from its data (`bert_flax.train.setup.RunLength`, recorded in config.json's
"resolved"; the config is not changed), the best parameters by the task's metric are kept in
`workdir/best`, and after training they predict the test split, if any.

A user error ends as one line with exit status 2, a diverged run with status 3
(`bert_flax.errors`). The logic lives in `bert_flax.train.loop.train_and_evaluate(config, workdir)`,
callable from a notebook.
"""

from __future__ import annotations

import json

from absl import app, flags
from ml_collections import config_flags

from bert_flax import errors
from bert_flax.runs.finished import FinalMetrics
from bert_flax.tasks import run_task, task_class
from bert_flax.train import loop, overrides

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Checkpoints, metrics, TensorBoard logs and plots.")
config_flags.DEFINE_config_file("config", None, "Config file (e.g. configs/tiny.py).")
flags.DEFINE_string(
    "predict",
    None,
    "Instead of training: a file for the workdir's best parameters (a fine-tuning run; "
    "classification: CSV/TSV/JSONL with text[, text_b]; squad: a SQuAD JSON file; "
    "token_classification: a CoNLL file).",
)
flags.DEFINE_string("output", None, "Where --predict writes (default beside the input file).")
flags.DEFINE_float(
    "null_threshold",
    None,
    "--predict, SQuAD v2.0: answer no-answer where its margin exceeds this (default: the "
    "threshold of the best evaluation).",
)
flags.mark_flag_as_required("workdir")


def predict(workdir: str, path: str, output: str | None, null_threshold: float | None) -> str:
    """`--predict`: the run's task's `predict_file`; returns its one-line summary."""
    options = {} if null_threshold is None else {"null_threshold": null_threshold}
    return task_class(run_task(workdir)).predict_file(workdir, path, output, **options)


def summary_lines(final: FinalMetrics) -> list[str]:
    """A fine-tuning run's result: its best evaluation, test split and submission files."""
    best = final["best"]
    if not best:
        return []
    lines = [
        f"best validation {best['metric']} {best['value']:.4f} at step {best['step']} "
        f"({final['baseline_name']}: {final['baseline']:.4f})"
    ]
    for name in ("test", "submissions"):  # a classifier's test split; GLUE's submission files
        if name in final:
            lines.append(f"{name}: {json.dumps(final[name])}")
    return lines


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.predict:
        print(predict(FLAGS.workdir, FLAGS.predict, FLAGS.output, FLAGS.null_threshold))
        return
    if FLAGS.config is None:
        raise app.UsageError("--config is required to train (or --predict=FILE to predict).")
    final = loop.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    loop.exit_if_preempted(final)
    for line in summary_lines(final):
        print(line)


if __name__ == "__main__":
    errors.run(main, flags_parser=overrides.flags_parser("config"))
