"""The pre-training task's batches: packed or padded rows as `config.data.packed` and
`config.eval.padded` say, from the prepared directory."""

from __future__ import annotations

import pytest

from bert_flax.tasks.pretraining import task as pretraining
from configs import default


@pytest.mark.parametrize(
    "packed, padded_eval, train_depth, eval_depth",
    [(True, False, 3, 3), (True, True, 3, 1), (False, False, 1, 1)],
)
def test_rows_are_packed_or_padded_as_the_config_says(
    data_dir, packed, padded_eval, train_depth, eval_depth
):
    config = default.get_config()
    config.data.update(synthetic=False, data_dir=data_dir, max_seq_length=128, packed=packed)
    config.eval.padded = padded_eval
    for train, depth in ((True, train_depth), (False, eval_depth)):
        batch = next(pretraining.dataset(config, "train", 8, train=train).as_numpy_iterator())
        assert batch["sequence_mask"].shape == (8, depth)  # D slots a row: 3 packed, 1 padded
