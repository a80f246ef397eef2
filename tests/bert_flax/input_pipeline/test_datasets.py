"""The packed pipeline: every example once per epoch, the contract's features and invariants."""

from __future__ import annotations

import collections
import os
import shutil

import numpy as np
import pytest

import packing
from bert_flax.data.verify_packing import example_key, reference_examples, unpack_row
from bert_flax.input_pipeline import datasets, planner, record_index, records
from bert_flax.input_pipeline.contract import load_strategies, max_predictions_per_pack

CLS = 101


def dataset(data_dir, batch_size, packed=True, **options):
    """`packed_dataset` (`padded_dataset` with packed=False) with these InputOptions."""
    entry = datasets.packed_dataset if packed else datasets.padded_dataset
    return entry(data_dir, batch_size, datasets.InputOptions(**options))


def first_epoch_stats(data_dir, **options) -> dict:
    return datasets.pack_stats(data_dir, datasets.InputOptions(**options))


def epoch(data_dir, batch_size=32, **kwargs) -> list[dict]:
    kwargs = {"process_index": 0, "process_count": 1, **kwargs}
    ds = dataset(data_dir, batch_size, repeat=False, drop_remainder=False, **kwargs)
    return list(ds.as_numpy_iterator())


def unpacked(batches: list[dict]) -> collections.Counter:
    """Examples recovered from every row; fails on any corrupted row."""
    seen: collections.Counter = collections.Counter()
    for batch in batches:
        for r in range(len(batch["input_ids"])):
            examples, problems = unpack_row({k: v[r] for k, v in batch.items()}, CLS)
            assert not problems, problems
            seen.update(examples)
    return seen


@pytest.fixture(scope="module")
def reference(data_dir) -> collections.Counter:
    return reference_examples(records.find_shards(data_dir, "train"))


@pytest.fixture(scope="module")
def packed_epoch(data_dir) -> list[dict]:
    return epoch(data_dir)


def test_packed_epoch_recovers_every_example_exactly_once(packed_epoch, reference):
    assert sum(reference.values()) > 1000
    assert unpacked(packed_epoch) == reference


def test_packed_rows_follow_the_contract(packed_epoch, summary):
    L = summary["options"]["max_seq_length"]
    P = max_predictions_per_pack(L, 3, 0.15, summary["options"]["max_predictions_per_seq"])
    batch = packed_epoch[0]
    shapes = {k: (v.shape, v.dtype) for k, v in batch.items()}
    expected = {
        **{k: ((32, L), np.int32) for k in ("input_ids", "token_type_ids", "segment_ids")},
        "positions": ((32, L), np.int32),
        "masked_lm_positions": ((32, P), np.int32),
        "masked_lm_ids": ((32, P), np.int32),
        "masked_lm_weights": ((32, P), np.float32),
        "cls_positions": ((32, 3), np.int32),
        "next_sentence_labels": ((32, 3), np.int32),
        "sequence_mask": ((32, 3), np.float32),
    }
    assert shapes == expected
    rows = {k: np.concatenate([b[k] for b in packed_epoch]) for k in batch}
    seg = rows["segment_ids"]
    # Segment ids are contiguous 1..k from the start, then padding.
    k = seg.max(axis=1)
    assert np.all(np.diff(seg, axis=1)[seg[:, 1:] > 0] >= 0)
    assert np.array_equal(rows["sequence_mask"].sum(1), k)
    # Positions restart at 0 at each sequence start; [CLS] at every nsp position.
    starts = np.diff(seg, axis=1, prepend=0) > 0
    assert np.all(rows["positions"][starts] == 0)
    assert np.all(rows["input_ids"][starts] == CLS)
    r, d = np.nonzero(rows["sequence_mask"])
    assert np.all(rows["input_ids"][r, rows["cls_positions"][r, d]] == CLS)
    assert np.all(seg[r, rows["cls_positions"][r, d]] == d + 1)
    # Masked positions are inside a sequence; padding is zero everywhere.
    w = rows["masked_lm_weights"] > 0
    rr = np.nonzero(w)[0]
    assert np.all(seg[rr, rows["masked_lm_positions"][w]] > 0)
    pad = seg == 0
    for name in ("input_ids", "token_type_ids", "positions"):
        assert np.all(rows[name][pad] == 0)
    assert np.all(rows["masked_lm_positions"][~w] == 0) and np.all(rows["masked_lm_ids"][~w] == 0)
    assert rows["sequence_mask"].sum() > len(seg)  # some rows really hold several sequences


def test_achieved_efficiency_matches_the_strategies(packed_epoch, data_dir):
    tokens = sum(int((b["segment_ids"] > 0).sum()) for b in packed_epoch)
    rows = sum(len(b["input_ids"]) for b in packed_epoch)
    predicted = packing.StrategySet.load(f"{data_dir}/strategies.json").metrics()
    assert 100 * tokens / (rows * 128) == pytest.approx(predicted.efficiency, abs=0.01)
    assert rows == predicted.packs
    stats = first_epoch_stats(data_dir)
    assert stats["rows"] == rows and stats["windows"] == 1
    assert stats["achieved_efficiency"] == pytest.approx(100 * tokens / (rows * 128))
    half = first_epoch_stats(data_dir, process_index=1, process_count=2)
    assert half["rows"] < rows and half["sequences"] < stats["sequences"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"packed": False},
        {"streaming": True, "online_buffer_size": 16},
        {"pack_window": 500},
        {"strategies": None, "algorithm": "spfhp", "max_sequences_per_pack": 2},
    ],
    ids=["padded", "streaming", "windowed", "spfhp_depth2"],
)
def test_other_modes_also_recover_every_example(data_dir, reference, kwargs, tmp_path):
    if kwargs.get("algorithm") == "spfhp":  # solve into a file of its own, not the shared one
        hist = packing.load_histogram(f"{data_dir}/histogram.txt")
        path = str(tmp_path / "spfhp.json")
        packing.pack_histogram(hist, 128, algorithm="spfhp", max_depth=2).save(path)
        kwargs = {**kwargs, "strategies": path}
    batches = epoch(data_dir, **kwargs)
    assert unpacked(batches) == reference
    depth = 1 if kwargs.get("packed") is False else kwargs.get("max_sequences_per_pack", 3)
    assert batches[0]["sequence_mask"].shape[1] == depth


def test_padded_rows_hold_one_sequence_each(data_dir, summary):
    batch = epoch(data_dir, packed=False)[0]
    assert np.all(batch["sequence_mask"] == 1)
    assert np.all(batch["cls_positions"] == 0)
    assert batch["masked_lm_positions"].shape[1] == summary["options"]["max_predictions_per_seq"]


def test_leftovers_of_an_unlimited_depth_strategy_file_are_packed_within_d(data_dir, reference):
    """A depth-0 (unlimited) strategy file that covers few sequences: the leftovers go to the
    fallback packer, which must still respect the rows' D = 3 (unlimited, it packs deeper)."""
    lengths = np.array([128] * 5 + [64] * 7 + [30] * 2)
    unlimited = packing.pack_histogram(
        packing.from_lengths(lengths, 128), 128, algorithm="lpfhp", max_depth=0
    )
    assert unlimited.max_depth == 0 and max(len(s) for s, _ in unlimited.strategies) <= 3
    short = np.random.default_rng(0).integers(8, 24, size=500)  # leftovers of 5-16 per row
    assert max(map(len, packing.assign_sequences(short, unlimited).packs)) > 3
    bounded = load_strategies(data_dir, unlimited, 128, 3, "nnlshp")
    assert bounded.max_depth == 3 and bounded.strategies == unlimited.strategies
    packs = packing.assign_sequences(short, bounded).packs
    assert max(map(len, packs)) == 3 and sorted(i for p in packs for i in p) == list(range(500))
    batches = epoch(data_dir, strategies=unlimited, max_sequences_per_pack=3)
    assert unpacked(batches) == reference


def test_windows_carry_their_leftovers_and_keep_the_whole_split_efficiency(data_dir, reference):
    """Small windows (a few hundred examples each) pack nearly as well as the whole split: what
    a window's strategies cannot place waits for the next window instead of the fallback."""
    whole = first_epoch_stats(data_dir)
    windowed = first_epoch_stats(data_dir, pack_window=200, seed=1)
    assert windowed["windows"] >= 5
    assert windowed["achieved_efficiency"] > whole["achieved_efficiency"] - 0.5
    index = record_index.RecordIndex.load_or_build(data_dir, "train")
    strategies = packing.StrategySet.load(f"{data_dir}/strategies.json")
    windows = planner.epoch_windows(np.arange(len(index)), 200, True, seed=1)
    plan = planner.epoch_plan(windows, index.lengths, strategies)
    packed_records = np.concatenate([w.records for w in plan])
    assert sorted(packed_records.tolist()) == list(range(len(index)))  # each record once
    assert any(len(w.records) != len(own) for w, own in zip(plan, windows))  # carries happen
    batches = epoch(data_dir, pack_window=200, seed=1)
    assert unpacked(batches) == reference
    assert sum(len(b["input_ids"]) for b in batches) == windowed["rows"]


@pytest.mark.parametrize("packed", [True, False])
def test_epoch_planner_positions_agree_with_its_stream(data_dir, packed):
    """The planner alone (lengths, no examples read): from any row, `windows` yields the
    uninterrupted stream's packs from that row on, across windows and epochs; an epoch packs
    every record of the host once (as record numbers through each window's plan)."""
    index = record_index.RecordIndex.load_or_build(data_dir, "train")
    strategies = packing.StrategySet.load(f"{data_dir}/strategies.json") if packed else None
    host = np.arange(len(index))
    epochs = planner.EpochPlanner(index.lengths, host, 200, strategies, True, lambda e: 7 + e)

    def stream(start_rows: int, rows: int) -> list[list[int]]:
        packs = []
        for plan, w, window_packs in epochs.windows(start_rows, repeat=True):
            records = plan[w].records
            packs += [sorted(records[p].tolist()) for p in window_packs]
            if len(packs) >= rows:
                return packs[:rows]

    per_epoch = sum(w.packs for w in epochs.plan(0))
    full = stream(0, 2 * per_epoch + 5)
    first_epoch = [r for p in full[:per_epoch] for r in p]
    assert sorted(first_epoch) == host.tolist()
    assert full[per_epoch:] != full[: len(full) - per_epoch]  # a new order each epoch
    for start in (1, 150, per_epoch - 1, per_epoch, per_epoch + 17):
        assert stream(start, 5) == full[start : start + 5], start
    assert epochs.position(per_epoch + 3, repeat=False) == (1, 0, 0)  # past the end


def test_uncovered_examples_go_to_the_fallback(data_dir, reference):
    """Strategies solved for another histogram (validation) still pack every train example."""
    lengths = np.array([128] * 5 + [64] * 7 + [20] * 3)
    other = packing.pack_histogram(packing.from_lengths(lengths, 128), 128, max_depth=3)
    assert unpacked(epoch(data_dir, strategies=other)) == reference


@pytest.mark.parametrize("count, streaming", [(2, False), (3, False), (3, True)])
def test_host_shards_are_disjoint_and_complete(data_dir, reference, count, streaming):
    # 8 shards: 2 hosts read whole files; 3 hosts read every third record.
    parts = [
        unpacked(epoch(data_dir, process_index=i, process_count=count, streaming=streaming))
        for i in range(count)
    ]
    assert all(sum(p.values()) > 0 for p in parts)
    assert sum(parts, collections.Counter()) == reference


def test_seed_determines_the_batches(data_dir):
    def first(seed, **kwargs):
        ds = dataset(data_dir, batch_size=8, seed=seed, **kwargs)
        return next(ds.as_numpy_iterator())["input_ids"]

    one_host = {"process_index": 0, "process_count": 1}
    assert np.array_equal(first(1), first(1, **one_host))  # default: jax.process_index()/count()
    assert not np.array_equal(first(1, **one_host), first(2, **one_host))


def test_without_shuffle_every_epoch_is_the_same(data_dir):
    rows = sum(len(b["input_ids"]) for b in epoch(data_dir, batch_size=64, shuffle=False))
    ds = dataset(data_dir, batch_size=rows, shuffle=False, process_index=0, process_count=1)
    it = ds.as_numpy_iterator()
    assert np.array_equal(next(it)["input_ids"], next(it)["input_ids"])


def test_repeat_flows_across_epochs_with_new_order(data_dir):
    rows = sum(len(b["input_ids"]) for b in epoch(data_dir, batch_size=64))
    ds = dataset(data_dir, batch_size=64, process_index=0, process_count=1)
    it = ds.as_numpy_iterator()
    batches = [next(it) for _ in range(2 * (rows // 64) + 2)]
    assert all(b["input_ids"].shape == (64, 128) for b in batches)
    first = np.concatenate([b["input_ids"] for b in batches])[:rows]
    second = np.concatenate([b["input_ids"] for b in batches])[rows : 2 * rows]
    assert not np.array_equal(first, second)  # epoch 2 is shuffled differently
    key = lambda rows: collections.Counter(r.tobytes() for r in rows)
    assert sum(key(first).values()) == sum(key(second).values())


def test_bad_arguments_raise_clear_errors(data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"summary\.json"):
        dataset(str(tmp_path), batch_size=4)
    with pytest.raises(FileNotFoundError, match="No test-"):
        dataset(data_dir, split="test", batch_size=4, process_count=1, process_index=0)
    with pytest.raises(ValueError, match="process_index=2"):
        dataset(data_dir, batch_size=4, process_index=2, process_count=2)
    wrong_length = packing.pack_histogram(packing.from_lengths([10, 20, 30], 64), 64)
    with pytest.raises(ValueError, match="max_seq_length=128"):
        dataset(data_dir, batch_size=4, strategies=wrong_length, process_index=0, process_count=1)
    deep = packing.pack_histogram(packing.from_lengths([10] * 30, 128), 128, max_depth=3)
    with pytest.raises(ValueError, match="max_sequences_per_pack=2"):
        dataset(
            data_dir,
            batch_size=4,
            strategies=deep,
            max_sequences_per_pack=2,
            process_index=0,
            process_count=1,
        )
    with pytest.raises(FileNotFoundError, match=r"nope\.json"):
        dataset(
            data_dir,
            batch_size=4,
            strategies=str(tmp_path / "nope.json"),
            process_index=0,
            process_count=1,
        )
    with pytest.raises(ValueError, match="max_predictions_per_pack=10"):
        dataset(
            data_dir, batch_size=4, max_predictions_per_pack=10, process_index=0, process_count=1
        )
    with pytest.raises(ValueError, match="batch_size"):
        dataset(data_dir, batch_size=0)


@pytest.mark.parametrize(
    "field", ["max_sequences_per_pack", "start_batch", "workers", "pack_window"]
)
def test_options_out_of_range_raise_naming_the_field(field):
    bad = -1 if field == "start_batch" else 0
    with pytest.raises(ValueError, match=f"{field} must be >= "):
        datasets.InputOptions(**{field: bad})


def test_missing_strategies_are_solved_and_saved(data_dir, tmp_path):

    for name in (
        "summary.json",
        "histogram.txt",
        *map(os.path.basename, records.find_shards(data_dir, "train")),
    ):
        shutil.copy(f"{data_dir}/{name}", tmp_path / name)
    batches = epoch(str(tmp_path), batch_size=64)
    assert (tmp_path / "strategies.json").exists()
    assert (
        sum(len(b["input_ids"]) for b in batches)
        == packing.StrategySet.load(str(tmp_path / "strategies.json")).metrics().packs
    )


def test_example_key_is_the_identity_of_all_features():
    a = example_key([101, 5, 102], [0, 0, 0], [1], [7], 0)
    assert a == example_key(np.array([101, 5, 102]), [0, 0, 0], [1], [7], 0)
    assert a != example_key([101, 5, 102], [0, 0, 0], [1], [7], 1)
    assert a != example_key([101, 5, 102], [0, 0, 1], [1], [7], 0)


@pytest.mark.parametrize(
    "mode",
    [{}, {"packed": False}, {"streaming": True}, {"pack_window": 500}],
    ids=["in_memory", "padded", "streaming", "windowed"],
)
def test_a_resumed_stream_equals_the_uninterrupted_one(data_dir, mode):
    """Batch for batch, from positions inside the first epoch and past epoch boundaries."""
    kwargs = {"batch_size": 256, "process_index": 0, "process_count": 1, "seed": 4, **mode}
    straight = dataset(data_dir, **kwargs).as_numpy_iterator()
    reference = [next(straight) for _ in range(24)]
    rows_per_epoch = first_epoch_stats(data_dir, seed=4)["rows"] if not mode else None
    if rows_per_epoch is not None:
        assert 24 * 256 > 2 * rows_per_epoch  # the 24 batches span more than two epochs
    for start in (3, 11, 20):
        resumed = dataset(data_dir, start_batch=start, **kwargs)
        for offset, batch in enumerate(resumed.take(4).as_numpy_iterator()):
            for name, value in batch.items():
                np.testing.assert_array_equal(
                    value, reference[start + offset][name], err_msg=f"{start}+{offset} {name}"
                )
