r"""Packed fine-tuning and packed inference: sequence classification (or regression) of single
sentences or sentence pairs, several examples per row.

  python -m bert_flax.finetune --config=configs/finetune_sentiment.py --workdir=workdir/sst \
      [--config.init_from=workdir/pretrain]        # a pre-training run, HF or bert_flax dir
  python -m bert_flax.finetune --workdir=workdir/sst --predict=reviews.csv \
      --output=predictions.jsonl                  # packed inference with the best parameters

Training is `bert_flax.train.train_and_evaluate` with a `ClassificationTask`: the same train
step, optimizers, mesh, checkpointing and preemption handling as pre-training. Epochs become
steps (`resolve_epochs`), evaluation runs every epoch on the validation split, and the best
parameters (by validation accuracy; MSE for regression) are kept in `workdir/best`. After
training, the best parameters predict the test split (`workdir/predictions_test.jsonl`).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import app, flags, logging
from jax.sharding import Mesh
from ml_collections import config_flags

from bert_flax import cli, overrides, parameters, sharding, train
from bert_flax.config import BertConfig
from bert_flax.data import classification, contract, tokenization
from bert_flax.model import BertForSequenceClassification
from bert_flax.tasks import ClassificationTask
from bert_flax.train_setup import adjust_for_packing

PREDICTIONS_FILE = "predictions_{split}.jsonl"


def resolve_epochs(config: ml_collections.ConfigDict, task: ClassificationTask) -> None:
    """Sets `train.steps` (= `train.epochs` x steps per epoch, at least `train.min_steps`), and
    `eval.every_steps` and `checkpoint.every_steps` to one epoch (or, with `eval.evaluations`,
    to that many evaluations over the run), for the rows per step after the packing adjustment."""
    mesh = sharding.create_mesh(config.mesh.shape, config.mesh.axes)
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


def predict(
    model_config: BertConfig,
    params: Any,
    num_labels: int,
    encoded: classification.EncodedSplit,
    *,
    rows: int = 32,
    max_sequences_per_pack: int = 8,
    packed: bool = True,
    algorithm: str = "lpfhp",
    pooling: str = "cls",
    mesh: Mesh | None = None,
) -> np.ndarray:
    """Outputs per example of `encoded`, in its order: logits [N, num_labels] float32.

    Several examples per row when `packed`; each example's output depends only on its own
    tokens (block-diagonal attention), so packed and padded inference agree example by example.
    Runs on `mesh` (default: every device, data parallel): the parameters placed by the
    logical-axis rules as in training, each batch of `rows` (rounded up to a multiple of the
    data-parallel size) split over the batch axes.
    """
    mesh = mesh or sharding.create_mesh((-1, 1, 1))
    data_parallel = sharding.data_parallel_size(mesh)
    batches = classification.batches(
        encoded,
        batch_size=-(-rows // data_parallel) * data_parallel,
        max_seq_length=encoded.max_seq_length,
        max_sequences_per_pack=max_sequences_per_pack if packed else 1,
        packed=packed,
        algorithm=algorithm,
        shuffle=False,
        pad_final=True,
    )
    first = next(batches)
    model = BertForSequenceClassification(model_config, num_labels, pooling)
    apply, shardings = sharded_logits(model, mesh, _model_inputs(first))
    params = jax.device_put(params, shardings)
    position = {int(example_id): k for k, example_id in enumerate(encoded.ids)}
    logits = np.full((len(encoded), num_labels), np.nan, np.float32)
    for batch in itertools.chain([first], batches):
        inputs = jax.device_put(_model_inputs(batch), sharding.batch_sharding(mesh))
        out = np.asarray(apply(params, inputs))
        real = batch["example_ids"] >= 0
        for example_id, value in zip(batch["example_ids"][real], out[real]):
            logits[position[int(example_id)]] = value
    if np.isnan(logits).any():
        raise RuntimeError("Some examples got no prediction; the packer lost them.")
    return logits


def _model_inputs(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: batch[name] for name in contract.CLASSIFICATION_INPUTS}


def sharded_logits(
    model: BertForSequenceClassification, mesh: Mesh, example: dict[str, np.ndarray]
) -> tuple[Callable, Any]:
    """`model`'s logits jitted on `mesh` under its logical-axis rules, and the parameters'
    shardings (from an abstract initialisation on `example`, a batch of the inputs)."""
    rules = sharding.rules_for_mesh(mesh)
    with sharding.partitioning(mesh, rules):
        abstract = jax.eval_shape(
            functools.partial(model.init, deterministic=True), jax.random.key(0), example
        )
    shardings = sharding.param_shardings(abstract, mesh, rules)["params"]
    apply = sharding.jit_partitioned(
        lambda p, b: model.apply({"params": p}, b, deterministic=True).logits,
        mesh,
        rules,
        in_shardings=(shardings, sharding.batch_sharding(mesh)),
        out_shardings=sharding.replicated(mesh),
    )
    return apply, shardings


def write_predictions(
    path: str, ids: Sequence[int], logits: np.ndarray, label_names: Sequence[str] | None
) -> None:
    """One JSON line per example, in input order: its id and prediction (label and
    probabilities, or the regression value)."""
    with open(path, "w") as f:
        for example_id, row in zip(ids, logits):
            record: dict[str, Any] = {"id": int(example_id)}
            if label_names is None:
                record["prediction"] = float(row[0])
            else:
                probabilities = np.exp(row - row.max())
                probabilities /= probabilities.sum()
                record["label"] = label_names[int(np.argmax(row))]
                record["probabilities"] = [round(float(p), 6) for p in probabilities]
            f.write(json.dumps(record) + "\n")


def predict_split(
    workdir: str, config: ml_collections.ConfigDict, task: ClassificationTask, split: str
) -> dict[str, float]:
    """The best parameters' predictions on `split`, written to the workdir; returns accuracy
    (or MSE) against the split's labels."""
    model_config, params, head = parameters.load_classifier(workdir)
    encoded = task.encoded[split]
    logits = predict(
        model_config,
        params,
        head["num_labels"],
        encoded,
        rows=config.eval.batch_size,
        max_sequences_per_pack=task.depth,
        packed=config.data.packed,
        algorithm=config.data.algorithm,
        pooling=head.get("pooling", "cls"),  # models fine-tuned before pooling existed: cls
    )
    path = os.path.join(workdir, PREDICTIONS_FILE.format(split=split))
    write_predictions(path, encoded.ids, logits, head["label_names"])
    if head["label_names"] is None:
        return {"mse": float(np.mean((logits[:, 0] - encoded.labels) ** 2)), "path": path}
    return {"accuracy": float(np.mean(logits.argmax(-1) == encoded.labels)), "path": path}


def finetune(
    config: ml_collections.ConfigDict, workdir: str, task: ClassificationTask | None = None
) -> dict[str, Any]:
    """Fine-tunes (`task`: default the config's, built here), then predicts the test split (if
    any) with the best parameters."""
    task = task or ClassificationTask(config)
    resolve_epochs(config, task)
    final = train.train_and_evaluate(config, workdir, task=task)
    if "test" in task.encoded and jax.process_index() == 0 and not final["preempted"]:
        final["test"] = predict_split(workdir, config, task, "test")
        logging.info("Test %s", json.dumps(final["test"]))
    return final


FLAGS = flags.FLAGS


def check_kind(split: classification.LabelledSplit, head: dict, path: str, workdir: str) -> None:
    """ValueError unless `path` holds the kind of examples (single texts or sentence pairs) the
    model was fine-tuned on (models fine-tuned before `sentence_pairs` was recorded: any)."""
    kinds = {False: "single texts (no `text_b` column)", True: "sentence pairs (`text_b`)"}
    pairs = split.texts_b is not None
    if head.get("sentence_pairs", pairs) != pairs:
        raise ValueError(
            f"{path} holds {kinds[pairs]}, but the model in {workdir} was fine-tuned on "
            f"{kinds[not pairs]}: give a file of its task."
        )


def define_flags() -> None:
    """The command line's flags (defined only when this module runs as the program)."""
    config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.")
    flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, best/).")
    flags.DEFINE_string(
        "predict",
        None,
        "Instead of training: a CSV/TSV/JSONL file (text[, text_b]) to classify with the "
        "workdir's best parameters.",
    )
    flags.DEFINE_string("output", None, "Where --predict writes its JSON lines.")
    flags.mark_flag_as_required("workdir")


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.predict:
        model_config, params, head = parameters.load_classifier(FLAGS.workdir)
        with open(os.path.join(FLAGS.workdir, "config.json")) as f:
            data = json.load(f)["data"]
        vocab = tokenization.load_vocab(head.get("vocab_file") or data.get("vocab_file") or None)
        split = classification.read_texts(FLAGS.predict)
        check_kind(split, head, FLAGS.predict, FLAGS.workdir)
        encoded = classification.encode_split(vocab, split, data["max_seq_length"])
        logits = predict(
            model_config,
            params,
            head["num_labels"],
            encoded,
            max_sequences_per_pack=data["max_sequences_per_pack"],
            algorithm=data["algorithm"],
            pooling=head.get("pooling", "cls"),
        )
        output = FLAGS.output or os.path.splitext(FLAGS.predict)[0] + ".predictions.jsonl"
        write_predictions(output, encoded.ids, logits, head["label_names"])
        print(f"{len(encoded)} predictions -> {output}")
        return
    if FLAGS.config is None:
        raise app.UsageError("--config is required to train (or --predict=FILE to classify).")
    final = finetune(FLAGS.config, FLAGS.workdir)
    train.exit_if_preempted(final)
    best = final.get("best") or {}
    print(
        f"best validation {best.get('metric')} {best.get('value', float('nan')):.4f} at step "
        f"{best.get('step')} ({final['baseline_name']}: {final['baseline']:.4f})"
    )
    if "test" in final:
        print(f"test: {json.dumps(final['test'])}")


if __name__ == "__main__":
    define_flags()
    cli.run(main, flags_parser=overrides.flags_parser("config"))
