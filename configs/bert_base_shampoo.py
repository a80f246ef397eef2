r"""BERT-base by the LAMB recipe (configs/bert_base_lamb.py) with asynchronous Shampoo instead.

  python -m bert_flax.train --config=configs/bert_base_shampoo.py:phase1 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_128
  python -m bert_flax.train --config=configs/bert_base_shampoo.py:phase2 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_512

Only the optimizer differs (tests/configs/test_configs_build.py checks): the same phases, batch,
warm-up, decay, packing and scanned layers (Shampoo blocks each layer of the stacked parameters
on its own: docs/optim.md). Anil et al. (arXiv 2002.09018): blocks of 128 (a 768 x 3072 FFN
kernel is 6 x 24 blocks), Adam grafting for the step size, roots every 100 steps computed on the
host while the accelerator keeps stepping with the previous ones (they report quality holding
for delays of ~1,200 steps).

The peak learning rate belongs to the optimizer: the graft is Adam's, whose rate is not LAMB's
(a trust ratio's). `adam_learning_rate`: BERT-base AdamW's (configs/bert_base.py, 1e-4 at 256
sequences) scaled to the phase's batch by the square-root rule (Malladi et al., 2022): 1.6e-3
at 65,536 sequences, 1.13e-3 at 32,768. Derived, not tuned at this scale.
"""

import math

import ml_collections

from configs import bert_base, bert_base_lamb


def adam_learning_rate(phase: str) -> float:
    """Adam's peak learning rate for the LAMB recipe's batch in `phase` (module doc)."""
    adamw, lamb = bert_base.get_config(phase), bert_base_lamb.get_config(phase)
    scale = lamb.train.batch_size / adamw.train.batch_size
    return adamw.schedule.learning_rate * math.sqrt(scale)


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    config = bert_base_lamb.get_config(phase)
    config.optimizer.name = "shampoo"
    config.optimizer.shampoo.update(
        asynchronous=True,
        block_size=128,
        graft="adam",
        b1=0.9,
        b2=0.999,
        # Statistics of the first steps are those of random weights: precondition after the
        # warm-up's first tenth (the race's start step 1 is the tiny model's optimum; not
        # measured at this scale).
        start_preconditioning_step=200,
        preconditioning_compute_steps=100,
        weight_decay=0.01,
    )
    config.schedule.learning_rate = adam_learning_rate(phase)
    return config
