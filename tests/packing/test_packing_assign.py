"""Assignment of real sequences to packs and the online packer: every index exactly once."""

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import packing

FAST = settings(max_examples=30, deadline=None)


def check_packs(packs, lengths, max_len, max_depth):
    for pack in packs:
        assert sum(lengths[i] for i in pack) <= max_len
        assert not max_depth or len(pack) <= max_depth


@FAST
@given(
    data=st.data(),
    algorithm=st.sampled_from(["spfhp", "lpfhp", "nnlshp", "lp"]),
    seed=st.integers(0, 3),
)
def test_every_index_exactly_once_even_for_another_shard(histogram_strategy, data, algorithm, seed):
    hist, max_len = data.draw(histogram_strategy())
    strategies = packing.pack_histogram(hist, max_len, algorithm, 3)
    # The examples to assign: the histogram's own, or another random shard of the same max_len.
    if data.draw(st.booleans()):
        lengths = np.repeat(np.arange(max_len + 1), hist)
    else:
        lengths = np.asarray(data.draw(st.lists(st.integers(1, max_len), max_size=80)), np.int64)
    assignment = packing.assign_sequences(lengths, strategies, seed=seed)
    flat = sorted(i for pack in assignment.packs for i in pack)
    assert flat == list(range(len(lengths)))
    assert assignment.dropped == []
    check_packs(assignment.packs, lengths, max_len, 3)


def test_own_histogram_follows_the_strategies_exactly(squad_histogram):
    lengths = np.repeat(np.arange(385), squad_histogram)
    strategies = packing.pack_histogram(squad_histogram, 384, "lpfhp", 3)
    assignment = packing.assign_sequences(lengths, strategies, seed=0)
    assert assignment.fallback_packs == 0 and len(assignment.packs) == strategies.num_packs
    made = collections.Counter(tuple(sorted(lengths[i] for i in p)) for p in assignment.packs)
    assert made == collections.Counter(dict(strategies.strategies))


def test_uncovered_examples_fall_back_or_are_dropped_on_request():
    strategies = packing.pack_histogram([0, 0, 2, 0, 2], 4, "spfhp", 2)  # (2, 2) and (4,)
    lengths = np.array([2, 2, 4, 1, 1, 3])
    assignment = packing.assign_sequences(lengths, strategies)
    assert sorted(i for p in assignment.packs for i in p) == list(range(6))
    assert assignment.fallback_packs == 2  # (3, 1) and (1,)
    assert assignment.strategy_packs == 2
    dropped = packing.assign_sequences(lengths, strategies, drop_unassigned=True)
    assert dropped.dropped == [3, 4, 5] and dropped.fallback_packs == 0
    assert sorted(i for p in dropped.packs for i in p) == [0, 1, 2]


def test_seed_changes_who_shares_a_pack_but_not_the_strategies():
    strategies = packing.pack_histogram([0, 8, 8], 3, "spfhp", 2)
    lengths = np.array([1] * 8 + [2] * 8)
    a = packing.assign_sequences(lengths, strategies, seed=0)
    b = packing.assign_sequences(lengths, strategies, seed=1)
    assert a.packs != b.packs
    assert sorted(map(sorted, a.packs)) != sorted(map(sorted, b.packs))
    shape = lambda packs: sorted(tuple(sorted(lengths[i] for i in p)) for p in packs)
    assert shape(a.packs) == shape(b.packs)
    assert a.packs == packing.assign_sequences(lengths, strategies, seed=0).packs


@pytest.mark.parametrize(
    ("lengths", "message"),
    [([1, 9], "outside 1..max_len=4"), ([0], "outside"), ([1.5], "integers"), ([[1]], "1-D")],
)
def test_assign_rejects_bad_lengths(lengths, message):
    strategies = packing.pack_histogram([0, 1], 4, "spfhp")
    with pytest.raises(ValueError, match=message):
        packing.assign_sequences(np.asarray(lengths), strategies)


@FAST
@given(
    lengths=st.lists(st.integers(1, 32), max_size=200),
    max_depth=st.integers(0, 4),
    buffer_size=st.integers(1, 8),
)
def test_online_packer_emits_every_index_once_within_bounds(lengths, max_depth, buffer_size):
    packer = packing.OnlinePacker(32, max_depth, buffer_size)
    packs = []
    for i, n in enumerate(lengths):
        packs += packer.add(i, n)
        assert packer.num_open <= buffer_size
    packs += packer.flush()
    assert packer.num_open == 0
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    check_packs(packs, lengths, 32, max_depth)
    if packs:
        assert packer.efficiency == pytest.approx(100 * sum(lengths) / (32 * len(packs)))


def test_online_packer_best_fit_and_full_packs_leave_at_once():
    packer = packing.OnlinePacker(10, max_depth=3, buffer_size=4)
    assert packer.add(0, 6) == []
    assert packer.add(1, 3) == []  # joins pack 0 (room 4, best fit for 3)
    assert packer.add(2, 5) == []  # no room left in pack 0: a new pack
    assert packer.add(3, 1) == [[0, 1, 3]]  # fills pack 0 exactly
    assert packer.flush() == [[2]]
    assert packer.efficiency == pytest.approx(100 * 15 / 20)


def test_online_packer_rejects_bad_input():
    with pytest.raises(ValueError, match="max_len"):
        packing.OnlinePacker(0)
    with pytest.raises(ValueError, match="buffer_size"):
        packing.OnlinePacker(8, 3, 0)
    with pytest.raises(ValueError, match="max_depth"):
        packing.OnlinePacker(8, -1)
    with pytest.raises(ValueError, match=r"in 1\.\.8"):
        packing.OnlinePacker(8).add(0, 9)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_count_packs_is_the_number_of_packs_assign_makes_with_either_fallback(data):
    """On lengths other than the strategies' histogram (leftovers and fallback included); the
    optimizing fallback packs every leftover too, in no more rows than the greedy one."""
    max_len = data.draw(st.integers(8, 64))
    solved = data.draw(st.lists(st.integers(1, max_len), min_size=1, max_size=200))
    lengths = data.draw(st.lists(st.integers(1, max_len), min_size=0, max_size=300))
    algorithm = data.draw(st.sampled_from(["spfhp", "lpfhp", "nnlshp", "lp"]))
    strategy_set = packing.pack_histogram(
        packing.from_lengths(solved, max_len), max_len, algorithm, 3
    )
    counts = np.bincount(np.asarray(lengths, np.int64), minlength=max_len + 1)
    rows = {}
    for fallback in ("spfhp", "lp"):
        packs = packing.assign_sequences(lengths, strategy_set, seed=1, fallback=fallback).packs
        assert packing.count_packs(counts, strategy_set, fallback=fallback) == len(packs)
        assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
        check_packs(packs, lengths, max_len, 3)
        rows[fallback] = len(packs)
    assert rows["lp"] <= rows["spfhp"]
