r"""BERT-base without packing (one sequence per row), for comparison with configs/bert_base.py.

  python -m bert_flax.train --config=configs/bert_base_padded.py:phase1 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_128
"""

import ml_collections

from configs import bert_base


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    config = bert_base.get_config(phase)
    config.data.packed = False
    config.train.packing_hparams = "none"
    return config
