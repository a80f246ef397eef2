r"""The tiny demo without packing (one sequence per row), for comparison with configs/tiny.py.

  python -m bert_flax.train --config=configs/tiny_padded.py --workdir=workdir/tiny_padded \
      --config.data.data_dir=workdir/sotu_128
"""

import ml_collections

from configs import tiny


def get_config() -> ml_collections.ConfigDict:
    config = tiny.get_config()
    config.data.packed = False
    config.train.packing_hparams = "none"
    return config
