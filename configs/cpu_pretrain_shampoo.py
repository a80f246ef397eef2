r"""The CPU pre-training recipe (configs/cpu_pretrain.py) with Shampoo: inverse roots computed on
the host, asynchronously. What `make demo` trains.

  python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=workdir/sotu_cpu \
      --document_mode=blank_line --max_seq_length=256 --train_vocab_size=8192 --dupe_factor=5
  python -m bert_flax.main --config=configs/cpu_pretrain_shampoo.py \
      --workdir=workdir/cpu_pretrain_shampoo --config.data.data_dir=workdir/sotu_cpu

Everything but the optimizer is the recipe's. Why Shampoo for the demo, measured on 2 cores
(docs/training.md, "The demo" and "Time to accuracy"): it reaches 0.25 eval masked-LM accuracy
in 700 steps, where packed LAMB needs 1,000 and Muon 800, and its step costs little more than
theirs: the Adam-grafted direction through two 128 x 128 roots per block, the roots on a host
thread every 10 steps. So a packed step of 7 rows stays about p times cheaper than a padded one of
16 (2.18x side by side at p = 2.35). SOAP (configs/cpu_pretrain_soap.py) learns a little more per
step (0.274 against 0.262 at step 800), but its rotations into and out of the eigenbases cost the
same for 7 rows as for 16, which held the demo's packed step to 0.84 x p. Learning rate 2e-3: the
centre of the time-to-accuracy grid (1e-3, 2e-3 and 4e-3 reach 0.25 in 700, 700 and 800 steps).
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
