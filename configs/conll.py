r"""Token classification (NER, POS, chunking), packed: several sentences a row.

  # the tiny BERT on the bundled rule-tagged set (names, numbers, months), on a CPU:
  python -m bert_flax.finetune --config=configs/conll.py --workdir=workdir/rule_ner
  python -m bert_flax.finetune --workdir=workdir/rule_ner --predict=dev.txt  # dev.txt.predicted
  # BERT-base on CoNLL-2003 (bert_flax.convert --from_hf ... --out DIR), on a TPU or GPU:
  python -m bert_flax.finetune --config=configs/conll.py:base --workdir=workdir/conll \
      --config.init_from=DIR --config.data.train_file=eng.train \
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

    config.data = ml_collections.ConfigDict()
    config.data.dataset = "rule_ner"  # bert_flax/tasks/token_classification/rule_set.py
    config.data.rule_sentences = 4000 if size == "cpu" else 0  # > 0: at most this many a split
    config.data.train_file = ""  # CoNLL files: the word, then columns; blank between sentences
    config.data.validation_file = ""
    config.data.test_file = ""  # optional: predicted after training
    config.data.label_column = -1  # which column holds the label (-1: the last; 0 is the word)
    config.data.label_scheme = "IOB2"  # the files' scheme: IOB1, IOB2, BIOES or none (POS)
    config.data.convert_to = ""  # a scheme to train and score in, if not the files'
    config.data.tfds_name = "conll2003"  # dataset = "tfds": a prepared TFDS builder
    config.data.tfds_label = "ner"  # its tag feature (conll2003: ner, pos, chunks)
    config.data.tfds_data_dir = ""  # "": TFDS's default
    config.data.train_sentences = 0  # > 0: only the first this many training sentences
    config.data.validation_sentences = 0  # > 0: only the first this many validation sentences
    config.data.label_all_subwords = False  # False: a word's label on its first sub-word only
    config.data.vocab_file = ""  # "": config.init_from's, else bert-base-uncased's
    # None: as config.init_from was trained (its tokenizer config), else uncased unless the
    # vocabulary is cased; True or False to force it.
    config.data.lowercase = ml_collections.config_dict.placeholder(bool)
    config.data.max_seq_length = 128
    config.data.packed = True
    config.data.max_sequences_per_pack = 16
    config.data.algorithm = "lpfhp"
    config.data.shuffle = True

    # How entities are read off tags for the scores: "conlleval" (lenient: as the conlleval
    # script that CoNLL-2003 results are reported with, and seqeval's default mode) or "strict"
    # (the scheme's rules, seqeval's mode="strict").
    config.token_classification = ml_collections.ConfigDict({"entity_mode": "conlleval"})

    default.for_finetuning(config)
    config.schedule.learning_rate = 1e-3 if size == "cpu" else 5e-5
    config.train.epochs = 2.0 if size == "cpu" else 3.0
    if size == "base":
        config.train.dtype = "bfloat16"
        default.for_accelerators(config)
    return config
