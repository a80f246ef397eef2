"""Shampoo's blocking: merged dims, factor shapes for 1-D..4-D, and the block layout."""

import jax.numpy as jnp
import numpy as np
import pytest

from optim.shampoo_blocks import (
    BlockPlan,
    apply_factor,
    diagonal_statistic,
    factor_statistic,
    merge_small_dims,
)


@pytest.mark.parametrize(
    "shape, max_dim, merged",
    [
        ((3, 3, 64, 128), 128, (9, 64, 128)),
        ((1, 8, 1, 16), 128, (8, 16)),  # stays a matrix
        ((4, 4, 4), 64, (16, 4)),
        ((1, 300, 1), 128, (300,)),
        ((128, 2, 64), 128, (128, 128)),
        ((), 128, ()),
        ((1, 1), 128, ()),
    ],
)
def test_merge_small_dims(shape, max_dim, merged):
    assert merge_small_dims(shape, max_dim) == merged


@pytest.mark.parametrize(
    "shape, factor_shapes, diagonal_shapes",
    [
        ((300,), (), ((300,),)),  # vector: elementwise diagonal
        ((), (), ((),)),  # scalar: elementwise diagonal
        ((4, 1, 8), ((1, 4, 4), (1, 8, 8)), ()),  # a small matrix stays a matrix
        ((1, 300), (), ((1, 300),)),  # a vector in disguise
        ((40, 30), ((1, 40, 40), (1, 30, 30)), ()),  # one block
        ((300, 50), ((3, 100, 100), (3, 50, 50)), ()),  # 300 -> 3 blocks of 100
        ((130, 260), ((6, 65, 65), (6, 87, 87)), ()),  # balanced blocks: 2 x 65, 3 x 87 (pad 1)
        ((5000, 64), ((1, 64, 64),), ((1, 5000),)),  # 5000 > max_preconditioner_dim: diagonal
        ((3, 3, 16, 200), ((2, 9, 9), (2, 16, 16), (2, 100, 100)), ()),  # 4-D conv kernel
        ((2, 6000, 3), ((1, 2, 2), (1, 3, 3)), ((1, 6000),)),  # 3-D, diagonal middle dim
    ],
)
def test_factor_shapes(shape, factor_shapes, diagonal_shapes):
    plan = BlockPlan.create(shape, block_size=128, max_preconditioner_dim=4096)
    assert plan.factor_shapes == factor_shapes
    assert plan.diagonal_shapes == diagonal_shapes


@pytest.mark.parametrize("shape", [(300, 50), (130, 260), (3, 3, 16, 200), (2, 6000, 3)])
def test_block_unblock_round_trip_and_layout(shape):
    plan = BlockPlan.create(shape, block_size=128, max_preconditioner_dim=4096)
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape) + 1.0
    blocks = plan.block(x)
    assert blocks.shape == (plan.num_blocks, *plan.block_dims)
    np.testing.assert_array_equal(plan.unblock(blocks), x)
    # Every element appears once; the rest is zero padding.
    values = np.asarray(blocks).ravel()
    np.testing.assert_array_equal(np.sort(values[values > 0]), np.asarray(x).ravel())


def test_block_statistics_match_numpy_per_block():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(300, 50)).astype(np.float32)
    plan = BlockPlan.create(g.shape, block_size=128, max_preconditioner_dim=4096)
    blocks = plan.block(jnp.asarray(g))
    left, right = factor_statistic(blocks, 0), factor_statistic(blocks, 1)
    for i in range(3):
        gi = g[100 * i : 100 * (i + 1)]
        np.testing.assert_allclose(left[i], gi @ gi.T, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(right[i], gi.T @ gi, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(diagonal_statistic(blocks, 1)[i], (gi**2).sum(0), rtol=1e-5)
    m = rng.normal(size=(3, 100, 100)).astype(np.float32)
    m = m + m.transpose(0, 2, 1)
    out = apply_factor(blocks, jnp.asarray(m), 0)
    for i in range(3):
        np.testing.assert_allclose(out[i], m[i] @ g[100 * i : 100 * (i + 1)], rtol=1e-4, atol=1e-3)
