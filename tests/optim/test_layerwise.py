"""Stacked layers updated slice by slice: the same steps as the unrolled parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optim

LAYERS = 3


def unrolled_and_stacked(seed=0):
    rng = np.random.default_rng(seed)
    layers = [
        {"kernel": rng.normal(size=(8, 6)).astype(np.float32) * (i + 1),
         "bias": rng.normal(size=(6,)).astype(np.float32)}
        for i in range(LAYERS)
    ]  # fmt: skip
    table = rng.normal(size=(10, 8)).astype(np.float32)
    unrolled = {"bert": {f"layer_{i}": layer for i, layer in enumerate(layers)}, "table": table}
    stacked = {
        "bert": {"layers": jax.tree.map(lambda *xs: np.stack(xs), *layers)},
        "table": table,
    }
    return unrolled, stacked


def run(tx, params, grads_fn, steps=3):
    state = tx.init(params)
    for step in range(steps):
        updates, state = tx.update(grads_fn(params, step), state, params)
        params = jax.tree.map(jnp.add, params, updates)
    return params


@pytest.mark.parametrize("name", ["lamb", "muon", "adamw"])
def test_layerwise_steps_equal_the_unrolled_steps(name):
    unrolled, stacked = unrolled_and_stacked()

    def grads(params, step):  # any gradient that differs per leaf and step
        return jax.tree.map(lambda p: jnp.sin(p * (step + 1)), params)

    plain = run(optim.create(name, learning_rate=0.1, grad_clip_norm=1.0), unrolled, grads)
    per_layer = optim.create(
        name, learning_rate=0.1, grad_clip_norm=1.0, layerwise=lambda n: n[:2] == ["bert", "layers"]
    )
    got = run(per_layer, stacked, grads)
    for i in range(LAYERS):
        for leaf in ("kernel", "bias"):
            np.testing.assert_allclose(
                got["bert"]["layers"][leaf][i], plain["bert"][f"layer_{i}"][leaf], rtol=2e-5,
                atol=1e-6, err_msg=f"{name} layer {i} {leaf}",
            )  # fmt: skip
    np.testing.assert_allclose(got["table"], plain["table"], rtol=2e-5, atol=1e-6)


def test_shampoo_and_soap_refuse_stacked_layers():
    with pytest.raises(ValueError, match="scan_layers=False"):
        optim.create("shampoo", learning_rate=0.1, layerwise=lambda names: True)
