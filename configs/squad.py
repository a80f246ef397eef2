r"""Extractive question answering (SQuAD v1.1 / v2.0), packed: several (question, context
window) sequences a row.

  # BERT-base from a checkpoint (bert_flax.convert --from_hf ... --out DIR), on a TPU or GPU:
  python -m bert_flax.finetune --config=configs/squad.py:base --workdir=workdir/squad \
      --config.init_from=DIR --config.data.train_file=train-v1.1.json \
      --config.data.validation_file=dev-v1.1.json           # or the v2.0 files
  python -m bert_flax.finetune --workdir=workdir/squad --predict=dev-v1.1.json  # predictions.json
  # the tiny BERT on the bundled cloze set, on a CPU (benchmarks/studies/squad_packed_vs_padded.py):
  python -m bert_flax.finetune --config=configs/squad.py --workdir=workdir/cloze \
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

    config.data = ml_collections.ConfigDict()
    config.data.dataset = "cloze"  # the bundled set (bert_flax.tasks.squad.cloze)
    config.data.train_file = ""  # SQuAD v1.1 / v2.0 JSON
    config.data.validation_file = ""
    config.data.split_seed = 0  # which cloze questions each context gets
    config.data.train_examples = 0  # > 0: only the first this many training questions
    config.data.validation_examples = 0  # > 0: only the first this many validation questions
    config.data.vocab_file = ""  # "": config.init_from's, else bert-base-uncased's
    # Lower-case the text (an uncased model) or not (a cased one); None: as config.init_from was
    # trained (its prepared data's summary, or do_lower_case in the tokenizer_config.json beside
    # its weights), else uncased. Recorded in best/best.json and in an exported tokenizer.
    config.data.lowercase = ml_collections.config_dict.placeholder(bool)
    config.data.max_seq_length = 384
    config.data.doc_stride = 128
    config.data.max_query_length = 64
    config.data.packed = True
    config.data.max_sequences_per_pack = 3
    config.data.algorithm = "lpfhp"
    config.data.shuffle = True
    config.squad = ml_collections.ConfigDict({"n_best": 20, "max_answer_length": 30})

    default.for_finetuning(config)
    config.schedule.learning_rate = 1e-3 if size == "cpu" else 3e-5
    config.train.epochs = 2.0
    if size == "base":
        config.train.dtype = "bfloat16"
        default.for_accelerators(config)
    return config
