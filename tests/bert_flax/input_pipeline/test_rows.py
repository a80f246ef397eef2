"""The one row builder: pre-training rows against a token-by-token reference, classification
rows by hand, and the errors of packs that do not fit."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import packing
from bert_flax.input_pipeline import records
from bert_flax.input_pipeline.contract import CLASSIFICATION_FEATURES, RowShape
from bert_flax.input_pipeline.rows import build_rows, epoch_seed
from bert_flax.tasks.classification.data import EncodedSplit


def naive_rows(table, packs, L, D, P) -> dict:
    """Reference row assembly, one token at a time."""
    out = collections.defaultdict(list)
    for pack in packs:
        row = {k: [0] * n for k, n in [("ids", L), ("tt", L), ("seg", L), ("pos", L)]}
        mlm_pos, mlm_ids, nsp, labels = [], [], [], []
        t = 0
        for d, i in enumerate(pack):
            ex = table.example(i)
            nsp.append(t)
            labels.append(ex.next_sentence_label)
            for j, (tok, typ) in enumerate(zip(ex.input_ids, ex.token_type_ids)):
                row["ids"][t + j], row["tt"][t + j] = tok, typ
                row["seg"][t + j], row["pos"][t + j] = d + 1, j
            mlm_pos += [t + p for p in ex.masked_lm_positions]
            mlm_ids += list(ex.masked_lm_ids)
            t += len(ex.input_ids)
        k, m = len(pack), len(mlm_pos)
        out["input_ids"].append(row["ids"])
        out["token_type_ids"].append(row["tt"])
        out["segment_ids"].append(row["seg"])
        out["positions"].append(row["pos"])
        out["masked_lm_positions"].append(mlm_pos + [0] * (P - m))
        out["masked_lm_ids"].append(mlm_ids + [0] * (P - m))
        out["masked_lm_weights"].append([1.0] * m + [0.0] * (P - m))
        out["cls_positions"].append(nsp + [0] * (D - k))
        out["next_sentence_labels"].append(labels + [0] * (D - k))
        out["sequence_mask"].append([1.0] * k + [0.0] * (D - k))
    return {k: np.array(v) for k, v in out.items()}


def test_build_rows_matches_a_token_by_token_reference(data_dir):
    table = records.read_table(records.find_shards(data_dir, "train")[:1], 128, 20)
    rng = np.random.default_rng(0)
    assignment = packing.assign_sequences(
        table.lengths, packing.StrategySet.load(f"{data_dir}/strategies.json"), seed=3
    )
    packs = [assignment.packs[i] for i in rng.choice(len(assignment.packs), 40, replace=False)]
    shape = RowShape(128, 3, 22)
    got = build_rows(table, packs, shape)
    want = naive_rows(table, packs, 128, 3, 22)
    assert got.keys() == want.keys()
    for name in got:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_build_rows_rejects_overfull_packs(data_dir):
    table = records.read_table(records.find_shards(data_dir, "train")[:1], 128, 20)
    long = [int(i) for i in np.flatnonzero(table.lengths == 128)[:2]]
    with pytest.raises(ValueError, match="more than L=128"):
        build_rows(table, [long], RowShape(128, 3, 40))
    with pytest.raises(ValueError, match="more than D=1"):
        build_rows(table, [[0, 1]], RowShape(256, 1, 40))
    with pytest.raises(ValueError, match="max_predictions_per_pack=5"):
        build_rows(table, [long[:1]], RowShape(128, 1, 5))


def test_build_rows_by_hand():
    encoded = EncodedSplit(
        input_ids=np.array([101, 5, 102, 101, 6, 7, 102, 8, 102], np.int32),
        token_type_ids=np.array([0, 0, 0, 0, 0, 0, 0, 1, 1], np.int32),
        offsets=np.array([0, 3, 9]),
        labels=np.array([1, 0], np.int32),
        ids=np.array([40, 41], np.int32),
        max_seq_length=10,
        truncated=0,
    )
    rows = build_rows(encoded, [[1, 0], []], RowShape(10, 3))
    assert set(rows) == set(CLASSIFICATION_FEATURES)
    expected = {
        "input_ids": [[101, 6, 7, 102, 8, 102, 101, 5, 102, 0], [0] * 10],
        "token_type_ids": [[0, 0, 0, 0, 1, 1, 0, 0, 0, 0], [0] * 10],
        "segment_ids": [[1, 1, 1, 1, 1, 1, 2, 2, 2, 0], [0] * 10],
        "positions": [[0, 1, 2, 3, 4, 5, 0, 1, 2, 0], [0] * 10],
        "cls_positions": [[0, 6, 0], [0, 0, 0]],
        "labels": [[0, 1, 0], [0, 0, 0]],
        "sequence_mask": [[1, 1, 0], [0, 0, 0]],
        "example_ids": [[41, 40, -1], [-1, -1, -1]],
    }
    for name, value in expected.items():
        assert rows[name].tolist() == value, name
        assert rows[name].dtype == (np.float32 if name == "sequence_mask" else np.int32)
    with pytest.raises(ValueError, match="more than L=8"):
        build_rows(encoded, [[0, 1]], RowShape(8, 3))
    with pytest.raises(ValueError, match="more than D=1"):
        build_rows(encoded, [[0, 1]], RowShape(10, 1))


def test_epoch_seeds_differ_by_epoch_and_host():
    seeds = {epoch_seed(0, epoch, host) for epoch in range(4) for host in range(4)}
    assert len(seeds) == 16
    assert epoch_seed(3, 1, 2) == epoch_seed(3, 1, 2)
