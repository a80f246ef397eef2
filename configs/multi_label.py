r"""Packed multi-label classification: a sigmoid per label, micro/macro F1 at a threshold tuned
on validation (`bert_flax.tasks.multi_label`).

  # the bundled review tags (fresh / film / exclaims, by rule), the tiny BERT on a CPU:
  python -m bert_flax.train --config=configs/multi_label.py --workdir=workdir/tags
  # your own: JSONL with text[, text_b] and a `labels` list (or CSV "a,b"), or 0/1 columns
  python -m bert_flax.train --config=configs/multi_label.py --workdir=workdir/mine \
      --config.data.train_file=train.jsonl --config.data.validation_file=dev.jsonl
  python -m bert_flax.train --config=configs/multi_label.py --workdir=workdir/toxic \
      --config.data.train_file=train.csv --config.data.label_columns=toxic,obscene,insult
  python -m bert_flax.train --workdir=workdir/tags --predict=texts.csv  # JSON lines

The recipe is configs/finetune_sentiment.py's (BERT's, packed with `divide_accumulation`).
"""

import ml_collections

from configs import finetune_sentiment


def get_config() -> ml_collections.ConfigDict:
    config = finetune_sentiment.get_config()
    config.task = "multi_label"
    # The bundled set (bert_flax.tasks.multi_label.task), or files with data.label_columns.
    config.data.dataset = "review_tags"
    return config
