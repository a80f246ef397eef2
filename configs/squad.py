r"""Extractive question answering (SQuAD v1.1 / v2.0), packed: several (question, context
window) sequences a row.

  # BERT-base from a checkpoint (a Hugging Face folder, read as it is), on a TPU or GPU:
  python -m bert_flax.train --config=configs/squad.py:base --workdir=workdir/squad \
      --config.init_from=/ckpt/bert-base-uncased --config.data.train_file=train-v1.1.json \
      --config.data.validation_file=dev-v1.1.json           # or the v2.0 files
  python -m bert_flax.train --workdir=workdir/squad --predict=dev-v1.1.json  # predictions.json
  # the tiny BERT on the bundled cloze set, on a CPU (benchmarks/studies/squad_packed_vs_padded.py):
  python -m bert_flax.train --config=configs/squad.py --workdir=workdir/cloze \
      [--config.init_from=workdir/demo/packed --config.model.preset=init_from]

Windows as google-research/bert's `run_squad.py`: 384 tokens, a document stride of 128, questions
cut to 64 tokens, answers of at most 30 tokens from the 20 best starts and ends. SQuAD 1.1's
windows pack at about 2.2 a row at 384 (`packing/data/squad_1_1_384.txt`), the cloze set's at
about 2.5 with 3 slots. BERT's recipe (batch 32, 2 epochs, learning rate 3e-5 for BERT-base
with 10% warm-up) is the padded one; packed, `divide_accumulation` keeps 32 sequences a step in
about 32 / p rows, as for classification (configs/finetune_sentiment.py).
"""

import ml_collections

from configs import default

SIZES = ("cpu", "base")


def get_config(size: str = "cpu") -> ml_collections.ConfigDict:
    if size not in SIZES:
        raise ValueError(f"Unknown size {size!r}; choose one of {SIZES}.")
    config = default.get_config()
    config.task = "squad"
    config.model.preset = "tiny" if size == "cpu" else "base"
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1

    # The bundled cloze set (bert_flax.tasks.squad.cloze), or data.train_file and
    # data.validation_file: SQuAD v1.1 / v2.0 JSON.
    config.data.dataset = "cloze"
    config.data.max_seq_length = 384
    config.data.max_sequences_per_pack = 3
    config.data.algorithm = "lpfhp"

    default.for_finetuning(config)
    config.schedule.learning_rate = 1e-3 if size == "cpu" else 3e-5
    config.train.epochs = 2.0
    if size == "base":
        config.train.dtype = "bfloat16"
        default.for_accelerators(config)
    return config
