"""Each block's range of blocks against the dense segment mask (and sliding window) reduced per
block."""

import numpy as np
import pytest

from bert_flax.kernels import block_ranges

L = 512


def packed_row(lengths, length=L) -> np.ndarray:
    """Segment ids of one row: sequence s (1-based) fills `lengths[s - 1]` tokens, then 0s."""
    return np.concatenate(
        [np.full(n, s, np.int32) for s, n in enumerate(lengths, 1)]
        + [np.zeros(length - sum(lengths), np.int32)]
    )


def random_lengths(rng, length=L, longest=300) -> list[int]:
    lengths = []
    while (n := int(rng.integers(1, longest))) + sum(lengths) <= length:
        lengths.append(n)
    return lengths


def rows() -> np.ndarray:
    """Random packings, an empty row, one sequence filling the row, many tiny sequences, and
    ids out of order."""
    rng = np.random.default_rng(0)
    lengths = [random_lengths(rng) for _ in range(6)] + [[], [L], [3] * 170, [1] * L, [127, 2]]
    shuffled = np.array([0, 3, 1, 2])[packed_row([100, 50, 200])]
    return np.stack([packed_row(n) for n in lengths] + [shuffled])


def visible_pairs(segment_ids, window=None) -> np.ndarray:
    """[batch, L, L]: whether query i sees key j (same segment, not padding, and within
    `window // 2` tokens unless `window` is None), pair by pair."""
    segment_ids = np.asarray(segment_ids)
    seen = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] != 0)
    if window is not None:
        position = np.arange(segment_ids.shape[1])
        seen &= np.abs(position[:, None] - position[None, :]) <= window // 2
    return seen


def visited_blocks(segment_ids, rows_block, cols_block, window=None) -> np.ndarray:
    """[batch, L // rows_block, L // cols_block]: whether any query of the row block sees a key
    of the column block (`visible_pairs`)."""
    seen = visible_pairs(segment_ids, window)
    batch = segment_ids.shape[0]
    blocks = seen.reshape(batch, L // rows_block, rows_block, L // cols_block, cols_block)
    return blocks.any(axis=(2, 4))


def as_blocks(first, stop, num_blocks) -> np.ndarray:
    index = np.arange(num_blocks)
    return (np.asarray(first)[..., None] <= index) & (index < np.asarray(stop)[..., None])


# Windows: none (global), smaller than a block, across blocks, longer than the row (global).
@pytest.mark.parametrize("window", [None, 16, 200, 2 * L])
@pytest.mark.parametrize(("block_q", "block_k"), [(128, 128), (64, 256), (256, 32)])
def test_ranges_cover_exactly_the_visited_blocks(block_q, block_k, window):
    segment_ids = rows()
    first, stop = block_ranges.kv_ranges(segment_ids, block_q, block_k, window)
    assert first.shape == stop.shape == (len(segment_ids), L // block_q)
    expected = visited_blocks(segment_ids, block_q, block_k, window)
    np.testing.assert_array_equal(as_blocks(first, stop, L // block_k), expected)
    # The transpose: the query blocks each kv block is seen from.
    first, stop = block_ranges.q_ranges(segment_ids, block_q, block_k, window)
    assert first.shape == (len(segment_ids), L // block_k)
    np.testing.assert_array_equal(as_blocks(first, stop, L // block_q), expected.transpose(0, 2, 1))
    fraction = block_ranges.visited_fraction(segment_ids, block_q, block_k, window)
    assert float(fraction) == pytest.approx(expected.mean())


def test_a_window_skips_the_blocks_of_one_sequence_beyond_it():
    """One sequence filling the row, a window of 32 in blocks of 64: each query block visits
    itself and its neighbours only, where without the window it visits all eight."""
    first, stop = block_ranges.kv_ranges(packed_row([L])[None], 64, 64, window=32)
    assert first.tolist() == [[0, 0, 1, 2, 3, 4, 5, 6]]
    assert stop.tolist() == [[2, 3, 4, 5, 6, 7, 8, 8]]


@pytest.mark.parametrize("window", [0, -2, 3, 2.0, True])
def test_a_window_the_kernels_cannot_take_names_the_fix(window):
    with pytest.raises(ValueError, match=r"window must be a positive even number .* or None"):
        block_ranges.kv_ranges(rows(), 128, 128, window)


def test_padding_visits_nothing_and_one_sequence_everything():
    first, stop = block_ranges.kv_ranges(np.stack([packed_row([]), packed_row([L])]), 128, 128)
    assert first.tolist() == [[0] * 4, [0] * 4] and stop.tolist() == [[0] * 4, [4] * 4]


def test_a_block_size_that_does_not_divide_the_row_names_the_fix():
    with pytest.raises(ValueError, match=r"block_k=96 does not divide the row length 512"):
        block_ranges.kv_ranges(rows(), 128, 96)


@pytest.mark.parametrize(("block_q", "block_k", "window"), [(128, 128, None), (64, 128, None),
                                                            (64, 64, 96)])  # fmt: skip
def test_expected_fraction_of_a_packing_is_that_of_its_rows_one_by_one(
    block_q, block_k, window, monkeypatch
):
    """A packing's (lengths, count) strategies against every row built and reduced by the
    dense mask, each repeated `count` times; rows of one sequence (padded) among them. Built
    three strategies at a time, to sum over several. A window visits less than global."""
    monkeypatch.setattr(block_ranges, "_ROWS_AT_ONCE", 3)
    rng = np.random.default_rng(1)
    strategies = [(random_lengths(rng), int(rng.integers(1, 5))) for _ in range(7)]
    strategies += [([L], 3), ([5], 2), ([int(n) for n in rng.integers(1, L, 1)], 1)]
    rows_one_by_one = np.stack([packed_row(n) for n, count in strategies for _ in range(count)])
    expected = visited_blocks(rows_one_by_one, block_q, block_k, window).mean()
    fraction = block_ranges.expected_visited_fraction(strategies, L, block_q, block_k, window)
    assert fraction == pytest.approx(expected)
    assert 0 < fraction < 1
    if window is not None:
        assert fraction < block_ranges.expected_visited_fraction(strategies, L, block_q, block_k)
