r"""BERT-base by the LAMB recipe (configs/bert_base_lamb.py) with asynchronous SOAP instead.

  python -m bert_flax.train --config=configs/bert_base_soap.py:phase1 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_128
  python -m bert_flax.train --config=configs/bert_base_soap.py:phase2 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_512

Only the optimizer differs (tests/configs/test_configs_build.py checks): the same phases, batch,
warm-up, decay, packing and scanned layers. SOAP (Vyas et al., arXiv 2409.11321) at the paper's
defaults (b1 = b2 = 0.95, statistics' b2 0.95, eigenbases every 10 steps, blocks of 128), the
eigenbases computed on the host while the accelerator keeps stepping with the previous ones.
SOAP is Adam in a rotated basis, so its peak learning rate is Adam's, as Shampoo's graft:
`bert_base_shampoo.adam_learning_rate` (derived, not tuned at this scale).
"""

import ml_collections

from configs import bert_base_lamb, bert_base_shampoo


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    config = bert_base_lamb.get_config(phase)
    config.optimizer.name = "soap"
    config.optimizer.soap.update(
        asynchronous=True,
        preconditioning_compute_steps=10,
        weight_decay=0.01,
    )
    config.schedule.learning_rate = bert_base_shampoo.adam_learning_rate(phase)
    return config
