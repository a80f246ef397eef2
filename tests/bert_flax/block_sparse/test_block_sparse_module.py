"""BlockSparseDense: parameters (nonzero blocks only, logical axes), init scaling, layouts."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_flax.block_sparse import BlockSparseLayout, block_sparse_matmul, random_layout
from bert_flax.block_sparse.module import BLOCKS_AXES, BlockSparseDense


def test_params_are_the_nonzero_blocks_with_logical_axes():
    layout = random_layout(64, 128, 16, 0.25, seed=0)
    layer = BlockSparseDense(128, layout=layout, kernel_axes=("embed", "mlp"))
    x = jnp.ones((2, 3, 64))
    variables = layer.init(jax.random.key(0), x)
    params = variables["params"]
    assert params["blocks"].value.shape == layout.blocks_shape
    assert params["blocks"].names == BLOCKS_AXES and params["bias"].names == ("mlp",)
    unboxed = nn.unbox(params)
    y = layer.apply(variables, x)
    expected = block_sparse_matmul(x, unboxed["blocks"], layout) + unboxed["bias"]
    np.testing.assert_allclose(y, expected, rtol=1e-6)


@pytest.mark.parametrize("dense_stddev", [None, 0.02])
def test_init_is_scaled_by_the_real_fan_in(dense_stddev):
    mask = np.zeros((32, 2), bool)
    mask[:, 0] = True  # fan-in 32 blocks
    mask[:4, 1] = True  # fan-in 4 blocks
    layout = BlockSparseLayout.from_mask(mask, 16)
    layer = BlockSparseDense(32, layout=layout, dense_stddev=dense_stddev, use_bias=False)
    blocks = nn.unbox(layer.init(jax.random.key(1), jnp.ones((1, 512))))["params"]["blocks"]
    w = layout.to_dense(blocks)
    base = 1.0 if dense_stddev is None else dense_stddev * np.sqrt(512)
    init_std = np.std(np.asarray(nn.initializers.truncated_normal(1.0)(jax.random.key(0), (4096,))))
    for col, fan_in in ((slice(0, 16), 512), (slice(16, 32), 64)):
        nonzero = w[:, col][w[:, col] != 0]
        assert np.std(nonzero) == pytest.approx(init_std * base / np.sqrt(fan_in), rel=0.1)


def test_generated_layouts_differ_per_layer_and_match_between_init_and_apply():
    class Two(nn.Module):
        @nn.compact
        def __call__(self, x):
            a = BlockSparseDense(64, block_size=16, density=0.3, name="a")
            b = BlockSparseDense(64, block_size=16, density=0.3, name="b")
            return a(x), b(x), a.get_layout(64), b.get_layout(64)

    model = Two()
    variables = model.init(jax.random.key(0), jnp.ones((1, 64)))
    *_, la, lb = model.apply(variables, jnp.ones((1, 64)))
    assert la != lb
    assert variables["params"]["a"]["blocks"].value.shape == la.blocks_shape


def test_mismatched_layout_is_rejected():
    layer = BlockSparseDense(64, layout=random_layout(32, 64, 16, 0.5))
    with pytest.raises(ValueError, match="layout is 32x64"):
        layer.init(jax.random.key(0), jnp.ones((1, 48)))


def test_training_only_touches_the_nonzero_blocks():
    layout = random_layout(32, 32, 8, 0.25, seed=5)
    layer = BlockSparseDense(32, layout=layout)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)
    teacher = rng.standard_normal(layout.blocks_shape) / np.sqrt(
        layout.fan_in()[layout.cols, None, None]
    )
    target = x @ jnp.asarray(layout.to_dense(teacher), jnp.float32)  # reachable by the layout
    params = nn.unbox(layer.init(jax.random.key(0), x))["params"]
    tx = optax.adam(3e-2)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((layer.apply({"params": p}, x) - target) ** 2)
        )(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(40):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    assert losses[-1] < 0.2 * losses[0]
    assert params["blocks"].shape == layout.blocks_shape
