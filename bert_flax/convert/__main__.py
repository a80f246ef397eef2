"""Checkpoint conversion on the command line: Hugging Face / Google BERT <-> bert_flax parameters.

# HF directory (config.json + model.safetensors or pytorch_model.bin) -> bert_flax
python -m bert_flax.convert --from_hf=/ckpt/bert-base-uncased --out=/ckpt/flax_base
# Google BERT TF checkpoint (bert_config.json + bert_model.ckpt.*) -> bert_flax
python -m bert_flax.convert --from_tf=/ckpt/uncased_L-12_H-768_A-12 --out=/ckpt/flax_base
# bert_flax -> HF directory loadable by transformers.BertForPreTraining.from_pretrained
python -m bert_flax.convert --from_flax=/ckpt/flax_base --to_hf=/ckpt/hf_base
# a training run (bert_flax.train's workdir; latest checkpoint or --step=N) -> HF / bert_flax
python -m bert_flax.convert --from_workdir=workdir/tiny --to_hf=/ckpt/hf_tiny
# a fine-tuning run (its best/) -> the transformers class of its task, with its tokenizer files:
# BertForSequenceClassification, BertForQuestionAnswering or BertForTokenClassification
python -m bert_flax.convert --from_workdir=workdir/sentiment --to_hf=/ckpt/hf_sentiment

--from_hf reads BertForPreTraining, encoder-only BertModel and task-headed folders
(BertForSequenceClassification, BertForQuestionAnswering, BertForTokenClassification), each
written back (--to_hf) as the class it is. The vocabulary a checkpoint was trained with (a
vocab.txt beside it, a run's prepared data's) and its case setting go with it, as tokenizer
files. Docs: docs/training.md, "Exporting to Hugging Face".
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import app, flags, logging

from bert_flax import errors
from bert_flax.convert import finetuned, google_bert, hugging_face, tables
from bert_flax.model.config import BertConfig
from bert_flax.runs import checkpoint_files, parameters, pretrained

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags (defined only when run as a program)."""
    flags.DEFINE_string("from_hf", None, "HF directory: config.json + model.safetensors / .bin.")
    flags.DEFINE_string("from_tf", None, "Google BERT checkpoint directory or prefix.")
    flags.DEFINE_string("tf_config", None, "bert_config.json (default: next to the TF checkpoint).")
    flags.DEFINE_string("from_flax", None, "bert_flax directory written by this tool.")
    flags.DEFINE_string(
        "from_workdir", None, "A training run: its latest checkpoint, a fine-tuning run's best/."
    )
    flags.DEFINE_integer(
        "step", None, "With --from_workdir: the checkpoint step (default: latest)."
    )
    flags.DEFINE_string(
        "out", None, "Output bert_flax directory (params.msgpack + bert_config.json)."
    )
    flags.DEFINE_string("to_hf", None, "Output HF directory (config.json + model.safetensors).")


def main(argv: list[str]) -> None:
    del argv
    sources = [s for s in (FLAGS.from_hf, FLAGS.from_tf, FLAGS.from_flax, FLAGS.from_workdir) if s]
    if len(sources) != 1:
        raise app.UsageError(
            "Give exactly one of --from_hf, --from_tf, --from_flax, --from_workdir."
        )
    if FLAGS.step is not None and not FLAGS.from_workdir:
        raise app.UsageError("--step selects a checkpoint of --from_workdir.")
    if not (FLAGS.out or FLAGS.to_hf):
        raise app.UsageError("Give --out (bert_flax) and/or --to_hf (Hugging Face).")
    head = fine_tuning_head(FLAGS.from_workdir) if FLAGS.from_workdir else None
    if head is not None:
        export_finetuned(FLAGS.from_workdir, head)
        return
    if FLAGS.from_hf:
        config, params = hugging_face.load_hf_checkpoint(FLAGS.from_hf)
    elif FLAGS.from_tf:
        config, params = google_bert.load_tf_checkpoint(FLAGS.from_tf, FLAGS.tf_config)
    elif FLAGS.from_workdir:
        config, params = checkpoint_files.load_workdir(FLAGS.from_workdir, FLAGS.step)
    else:
        config, params = parameters.load_params(FLAGS.from_flax)
    count = sum(v.size for v in tables.flatten(params).values())
    logging.info("Converted %d parameters (%s).", count, config)
    if FLAGS.out:
        parameters.save_params(params, config, FLAGS.out)
        save_vocabulary(sources[0], config, FLAGS.out)
        logging.info("Wrote %s", FLAGS.out)
    if FLAGS.to_hf:
        hugging_face.save_hf_checkpoint(params, config, FLAGS.to_hf)
        save_vocabulary(sources[0], config, FLAGS.to_hf)
        logging.info("Wrote %s", FLAGS.to_hf)
    print(f"converted {count:,} parameters")


def save_vocabulary(source: str, config: BertConfig, out: str) -> None:
    """The vocabulary and case setting `source` was trained with, where it says
    (`pretrained.pretrained_vocab_file`, `pretrained_lowercase`), as tokenizer files beside the
    converted weights: what `init_from` and `transformers.AutoTokenizer` read."""
    vocab = pretrained.pretrained_vocab_file(source)
    if vocab:
        lowercase = pretrained.pretrained_lowercase(source)
        finetuned.save_tokenizer(out, vocab, lowercase is not False, config)


def fine_tuning_head(workdir: str) -> dict[str, Any] | None:
    """The head config of a fine-tuning run's best parameters; None for a pre-training run."""
    path = os.path.join(workdir, parameters.BEST_DIR, parameters.BEST_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        head = json.load(f)
    return head if finetuned.task_of(head) else None


def export_finetuned(workdir: str, head: dict[str, Any]) -> None:
    """A fine-tuning run's best parameters as the transformers class of its task (--to_hf)."""
    if FLAGS.out or FLAGS.step is not None or not FLAGS.to_hf:
        raise ValueError(
            f"{workdir} is a fine-tuning run: give only --to_hf (its best parameters already "
            f"are a bert_flax directory, {os.path.join(workdir, parameters.BEST_DIR)})."
        )
    finetuned.hf_fields(head)  # refused before anything is read or written
    config, params, head = parameters.load_finetuned(workdir)
    finetuned.export_finetuned(params, config, head, FLAGS.to_hf)
    hf_class = finetuned.HF_CLASS_OF_TASK[finetuned.task_of(head)]
    print(f"wrote {hf_class} and its tokenizer to {FLAGS.to_hf}")


if __name__ == "__main__":
    define_flags()
    errors.run(main)
