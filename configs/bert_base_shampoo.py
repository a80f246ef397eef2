r"""BERT-base (configs/bert_base.py) with asynchronous Shampoo instead of AdamW.

  python -m bert_flax.train --config=configs/bert_base_shampoo.py:phase1 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_128
  python -m bert_flax.train --config=configs/bert_base_shampoo.py:phase2 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_512

Anil et al. (arXiv 2002.09018): blocks of 128 (a 768 x 3072 FFN kernel is 6 x 24 blocks), Adam
grafting for the step size, roots every 100 steps computed on the host while the accelerator
keeps stepping with the previous ones (they report quality holding for delays of ~1,200 steps).
The learning rate, warm-up and decay are BERT-base's, since the graft is Adam's.
"""

import ml_collections

from configs import bert_base


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    config = bert_base.get_config(phase)
    config.optimizer.name = "shampoo"
    # Shampoo's statistics are per parameter: it takes the layers unrolled (optim.layerwise).
    config.model.scan_layers = False
    config.optimizer.shampoo.update(
        asynchronous=True,
        block_size=128,
        graft="adam",
        b1=0.9,
        b2=0.999,
        # Statistics of the first steps of a 110M-parameter model are those of random
        # weights: precondition after the warm-up's first tenth (the race's start step 1 is
        # the tiny model's optimum; not measured at this scale).
        start_preconditioning_step=1_000,
        preconditioning_compute_steps=100,
        weight_decay=0.01,
    )
    return config
