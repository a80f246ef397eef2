r"""Token classification (NER, POS, chunking), packed: several sentences a row.

  # the tiny BERT on the bundled rule-tagged set (names, numbers, months), on a CPU:
  python -m bert_flax.train --config=configs/conll.py --workdir=workdir/rule_ner
  python -m bert_flax.train --workdir=workdir/rule_ner --predict=dev.txt  # dev.txt.predicted
  # BERT-base on CoNLL-2003 from a checkpoint (a Hugging Face folder, read as it is), on a TPU
  # or GPU:
  python -m bert_flax.train --config=configs/conll.py:base --workdir=workdir/conll \
      --config.init_from=/ckpt/bert-base-cased --config.data.train_file=eng.train \
      --config.data.validation_file=eng.testa --config.data.test_file=eng.testb \
      --config.data.label_scheme=IOB1 --config.data.convert_to=IOB2
  # or the prepared TFDS builder: --config.data.dataset=tfds (conll2003, its `ner` tags)

CoNLL-2003's sentences average about 14 words (about 20 WordPiece tokens with [CLS] and [SEP]),
so rows of 128 hold up to 16 of them. BERT's recipe for CoNLL-2003 (batch 32, learning rate
5e-5, 3 epochs) is the padded one; packed, `divide_accumulation` keeps 32 sentences a step in
about 32 / p rows.
"""

import ml_collections

from configs import default

SIZES = ("cpu", "base")


def get_config(size: str = "cpu") -> ml_collections.ConfigDict:
    if size not in SIZES:
        raise ValueError(f"Unknown size {size!r}; choose one of {SIZES}.")
    config = default.get_config()
    config.task = "token_classification"
    config.model.preset = "tiny" if size == "cpu" else "base"
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1

    # The bundled rule-tagged set (bert_flax/tasks/token_classification/rule_set.py; at most
    # rule_sentences a split), "tfds" (data.tfds_name's data.tfds_label tags), or
    # data.train_file, validation_file [, test_file]: CoNLL files (the word, then columns; blank
    # between sentences; the label in data.label_column, in data.label_scheme).
    config.data.dataset = "rule_ner"
    config.data.rule_sentences = 4000 if size == "cpu" else 0
    config.data.tfds_name = "conll2003"
    config.data.tfds_label = "ner"
    config.data.max_seq_length = 128
    config.data.max_sequences_per_pack = 16
    config.data.algorithm = "lpfhp"

    default.for_finetuning(config)
    config.schedule.learning_rate = 1e-3 if size == "cpu" else 5e-5
    config.train.epochs = 2.0 if size == "cpu" else 3.0
    if size == "base":
        config.train.dtype = "bfloat16"
        default.for_accelerators(config)
    return config
