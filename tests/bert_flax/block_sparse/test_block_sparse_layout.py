"""Layouts: generators (seeded, covered), small-world graph structure, validation, JSON I/O."""

import numpy as np
import pytest

from bert_flax.block_sparse import (
    BlockSparseLayout,
    barabasi_albert_graph,
    make_layout,
    random_layout,
    small_world_layout,
    watts_strogatz_graph,
)


def test_random_layout_density_seed_and_coverage():
    a = random_layout(512, 1024, 16, 0.1, seed=3)
    assert a.mask.shape == (32, 64)
    assert a.mask.any(axis=0).all() and a.mask.any(axis=1).all()
    assert a.nnz == round(0.1 * 32 * 64)  # exact count, coverage included
    assert random_layout(64, 2048, 32, 0.25).nnz == 64  # covering needs one block per column
    uniform = random_layout(512, 512, 16, 0.05, seed=0, ensure_coverage=False)
    assert uniform.nnz == round(0.05 * 32 * 32)
    assert a == random_layout(512, 1024, 16, 0.1, seed=3)
    assert hash(a) == hash(random_layout(512, 1024, 16, 0.1, seed=3))
    assert a != random_layout(512, 1024, 16, 0.1, seed=4)


def test_canonical_order_is_column_major_and_dense_round_trip():
    layout = random_layout(64, 96, 16, 0.5, seed=0)
    keys = layout.cols.astype(np.int64) * layout.in_blocks + layout.rows
    assert np.all(np.diff(keys) > 0)
    assert layout.mask[layout.rows, layout.cols].all() and layout.nnz == layout.mask.sum()
    blocks = np.random.default_rng(0).standard_normal(layout.blocks_shape)
    dense = layout.to_dense(blocks)
    np.testing.assert_array_equal(layout.from_dense(dense), blocks)
    zero = np.kron(~layout.mask, np.ones((16, 16), bool))
    assert np.all(dense[zero] == 0)
    block = dense[16 * layout.rows[5] : 16 * layout.rows[5] + 16][:, 16 * layout.cols[5] :][:, :16]
    np.testing.assert_array_equal(block, blocks[5])


@pytest.mark.parametrize(
    "mask, match",
    [
        (np.ones(4), "2-D"),
        (np.full((2, 2), 2), "0/1"),
        (np.zeros((3, 3)), "no nonzero block"),
        (np.array([[1, 0], [0, 0]]), "1 input block rows"),
    ],
)
def test_from_mask_validation(mask, match):
    with pytest.raises(ValueError, match=match):
        BlockSparseLayout.from_mask(mask, 8)


def test_allow_empty_and_bad_block_size():
    layout = BlockSparseLayout.from_mask(np.array([[1, 0], [0, 0]]), 8, allow_empty=True)
    assert layout.nnz == 1
    with pytest.raises(ValueError, match="block_size"):
        BlockSparseLayout.from_mask(np.ones((2, 2)), 0)
    with pytest.raises(ValueError, match="not a multiple of block_size"):
        random_layout(100, 64, 32, 0.5)
    with pytest.raises(ValueError, match="density"):
        random_layout(64, 64, 32, 0.0)
    with pytest.raises(ValueError, match="Unknown layout kind"):
        make_layout("banded", 64, 64, 32, 0.5)


def test_json_round_trip(tmp_path):
    layout = small_world_layout("watts_strogatz", 256, 512, 16, 0.2, seed=1)
    layout.save(tmp_path / "layout.json")
    loaded = BlockSparseLayout.load(tmp_path / "layout.json")
    assert loaded == layout and hash(loaded) == hash(layout)
    assert loaded.meta["kind"] == "watts_strogatz" and loaded.block_size == 16
    blocks = np.arange(loaded.nnz * 256.0).reshape(loaded.blocks_shape)
    np.testing.assert_array_equal(loaded.to_dense(blocks), layout.to_dense(blocks))


def test_watts_strogatz_structure():
    rng = np.random.default_rng(0)
    ring = watts_strogatz_graph(20, 4, 0.0, rng)
    assert (ring.sum(axis=1) == 4).all() and ring[0, 1] and ring[0, 2] and ring[0, 19]
    rewired = watts_strogatz_graph(64, 6, 0.3, rng)
    assert rewired.sum() == 64 * 6  # rewiring keeps the edge count (k per node)
    assert (rewired == rewired.T).all() and not rewired.diagonal().any()
    assert not np.array_equal(rewired, watts_strogatz_graph(64, 6, 0.0, rng))


def test_barabasi_albert_structure():
    n, m = 200, 3
    adj = barabasi_albert_graph(n, m, np.random.default_rng(0))
    assert (adj == adj.T).all() and not adj.diagonal().any()
    assert adj.sum() // 2 == m + m * (n - m - 1)
    degree = adj.sum(axis=1)
    assert degree.min() >= 1 and degree.max() > 4 * np.median(degree)  # hubs


@pytest.mark.parametrize("kind", ["watts_strogatz", "barabasi_albert"])
def test_small_world_layouts(kind):
    layout = make_layout(kind, 1024, 512, 16, 0.1, seed=0)
    assert layout.mask.shape == (64, 32)
    assert layout.mask.any(axis=0).all() and layout.mask.any(axis=1).all()
    assert 0.05 < layout.density < 0.2
    assert layout == make_layout(kind, 1024, 512, 16, 0.1, seed=0)
