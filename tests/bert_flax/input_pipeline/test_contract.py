"""The packed-batch contract: row shapes, the masked-positions bound, prepared data, check_batch."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from bert_flax.input_pipeline import contract, synthetic
from bert_flax.input_pipeline.contract import (
    PreparedData,
    RowShape,
    check_batch,
    max_predictions_per_pack,
)


def predictions_of(length: int, masked_lm_prob: float, per_seq: int) -> int:
    """How many positions create_pretraining_data masks in a sequence of `length` tokens."""
    return min(per_seq, max(1, round(length * masked_lm_prob)))


@pytest.mark.parametrize(("length", "depth", "per_seq"), [(32, 3, 5), (48, 2, 20), (40, 4, 3)])
def test_prediction_bound_holds_for_every_row_and_is_reached(length, depth, per_seq):
    """Against every way of filling a row with up to `depth` sequences of >= 2 tokens."""
    most = 0
    for k in range(1, depth + 1):
        for lengths in itertools.combinations_with_replacement(range(2, length + 1), k):
            if sum(lengths) <= length:
                most = max(most, sum(predictions_of(n, 0.15, per_seq) for n in lengths))
    bound = max_predictions_per_pack(length, depth, 0.15, per_seq)
    assert most <= bound <= most + depth


def test_prediction_bound_is_tight_enough():
    # floor(0.15 * 128) + 3 = 22, well under 3 * 20; one sequence alone keeps its own cap.
    assert max_predictions_per_pack(128, 3, 0.15, 20) == 22
    assert max_predictions_per_pack(128, 1, 0.15, 20) == 20
    assert max_predictions_per_pack(512, 3, 0.15, 77) == 79


def test_row_shape_padded_and_packed():
    packed = RowShape.bounded(128, 3, masked_lm_prob=0.15, max_predictions_per_seq=20)
    assert packed == RowShape(128, 3, 22)
    padded = RowShape.bounded(128, 3, masked_lm_prob=0.15, max_predictions_per_seq=20, packed=False)
    assert padded == RowShape(128, 1, 20)
    assert [packed.feature_shape(n) for n in ("positions", "masked_lm_ids", "sequence_mask")] == [
        (128,),
        (22,),
        (3,),
    ]
    with pytest.raises(KeyError, match="not a feature"):
        packed.feature_shape("label")


def test_prepared_data_reads_the_summary(tmp_path):
    summary = {
        "options": {"max_seq_length": 64, "max_predictions_per_seq": 10, "masked_lm_prob": 0.2},
        "vocab": {"size": 1000, "special_ids": {"cls": 2}},
        "splits": {"train": {"examples_per_shard": [5, 6]}, "validation": {}},
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    data = PreparedData.load(str(tmp_path))
    assert (data.max_seq_length, data.vocab_size, data.cls_id) == (64, 1000, 2)
    assert data.splits == {"train": 11, "validation": 0}
    # floor(0.2 * 64) + 2 = 14 < 2 * 10.
    assert data.row_shape(2) == RowShape(64, 2, 14)
    with pytest.raises(FileNotFoundError, match=r"histogram\.txt"):
        data.packing_factor(2, "spfhp")  # neither strategies.json nor a histogram to solve
    with pytest.raises(
        FileNotFoundError, match=r"summary\.json not found.*create_pretraining_data"
    ):
        PreparedData.load(str(tmp_path / "missing"))


def test_synthetic_batches_follow_the_contract(tiny_config):
    tiny_config = tiny_config.replace(vocab_size=512)
    shape = RowShape(48, 3, 9)
    batch = synthetic.random_batch(6, shape, vocab_size=512, seed=2)
    assert sorted(batch) == sorted(contract.PRETRAINING_FEATURES)
    check_batch(batch, tiny_config, shape)
    with pytest.raises(ValueError, match=r"masked_lm_positions has rows of shape \(9,\)"):
        check_batch(batch, tiny_config, RowShape(48, 3, 10))


def test_check_batch_names_the_bad_feature(tiny_config, sequences, make_batch):
    batch = make_batch([sequences[:2], sequences[2:]], 24, 3, 8)
    check_batch(batch, tiny_config, RowShape(24, 3, 8))
    cases = {
        "input_ids": ("input_ids", tiny_config.vocab_size),
        "positions": ("positions", tiny_config.max_position_embeddings),
        "segment_ids": ("segment_ids", 4),
    }
    for name, (feature, value) in cases.items():
        bad = {k: v.copy() for k, v in batch.items()}
        bad[feature][0, 0] = value
        with pytest.raises(ValueError, match=name):
            check_batch(bad, tiny_config)
    bad = {k: v.copy() for k, v in batch.items()}
    bad["masked_lm_positions"][0, 0] = 23  # padding position with weight 1
    with pytest.raises(ValueError, match="point at padding"):
        check_batch(bad, tiny_config)
    bad = {k: v for k, v in batch.items() if k != "sequence_mask"}
    with pytest.raises(ValueError, match="sequence_mask"):
        check_batch(bad, tiny_config)
    bad = dict(batch, masked_lm_weights=batch["masked_lm_weights"].astype(np.int64))
    with pytest.raises(ValueError, match="masked_lm_weights is int64, not float32"):
        check_batch(bad, tiny_config)
