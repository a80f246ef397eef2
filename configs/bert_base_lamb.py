r"""BERT-base with LAMB, packed: the packing paper's recipe (configs/bert_large.py's, for base).

  python -m bert_flax.train --config=configs/bert_base_lamb.py:phase1 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_128
  python -m bert_flax.train --config=configs/bert_base_lamb.py:phase2 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_512

NVIDIA's LAMB phases (65,536 sequences at 128, lr 6e-3, 2,000 warm-up, 7,038 steps; then 32,768
at 512, lr 4e-3, 200 warm-up, 1,563 steps; decay power 0.5), rows of about p sequences with
LAMB's betas raised to the power p (Krell et al., 2021): `bert_large.lamb_recipe`. The base
Shampoo and SOAP recipes (configs/bert_base_shampoo.py, bert_base_soap.py) are this one with
another optimizer; configs/bert_base.py is the original AdamW recipe (256 sequences, 1M steps).
"""

import ml_collections

from configs import bert_large


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    return bert_large.lamb_recipe("base", phase)
