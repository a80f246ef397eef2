"""Stacked layers updated layer by layer: the same steps as the unrolled parameters (Shampoo's
and SOAP's statistics, roots and host jobs included)."""

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
    update = jax.jit(tx.update)
    for step in range(steps):
        updates, state = update(grads_fn(params, step), state, params)
        state = optim.after_step(tx, state, step)  # Shampoo's and SOAP's host roots
        params = jax.tree.map(jnp.add, params, updates)
    return params


def grads(params, step):  # any gradient that differs per leaf and step
    return jax.tree.map(lambda p: jnp.sin(p * (step + 1)), params)


def assert_layers_match(got, plain, name):
    for i in range(LAYERS):
        for leaf in ("kernel", "bias"):
            np.testing.assert_allclose(
                got["bert"]["layers"][leaf][i], plain["bert"][f"layer_{i}"][leaf], rtol=2e-5,
                atol=1e-6, err_msg=f"{name} layer {i} {leaf}",
            )  # fmt: skip
    np.testing.assert_allclose(got["table"], plain["table"], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["lamb", "muon", "adamw"])
def test_layerwise_steps_equal_the_unrolled_steps(name):
    unrolled, stacked = unrolled_and_stacked()
    plain = run(optim.create(name, learning_rate=0.1, grad_clip_norm=1.0), unrolled, grads)
    per_layer = optim.create(
        name, learning_rate=0.1, grad_clip_norm=1.0, layerwise=lambda n: n[:2] == ["bert", "layers"]
    )
    assert_layers_match(run(per_layer, stacked, grads), plain, name)


# Blocks of 4 cut the [8, 6] kernel into 2 x 2 blocks; max_preconditioner_dim=7 gives its
# 8-long dimension a diagonal factor instead. The layers' scales differ (x1, x2, x3), so roots,
# ridges or grafts shared across layers would show.
ROOTS = dict(start_preconditioning_step=2, preconditioning_compute_steps=2, block_size=4)


@pytest.mark.parametrize(
    "name, options",
    [
        ("shampoo", {}),
        ("shampoo", {"max_preconditioner_dim": 7}),
        ("shampoo", {"asynchronous": True, "max_staleness": 1, "swap_when_done": False}),
        ("soap", {}),
        ("soap", {"asynchronous": True, "max_staleness": 1, "swap_when_done": False}),
    ],
)
def test_shampoo_and_soap_precondition_stacked_layers_as_unrolled(name, options):
    unrolled, stacked = unrolled_and_stacked()
    hparams = dict(learning_rate=0.1, grad_clip_norm=1.0, **ROOTS, **options)
    plain = run(optim.create(name, **hparams), unrolled, grads, steps=7)
    per_layer = optim.create(name, layerwise=lambda n: n[:2] == ["bert", "layers"], **hparams)
    assert_layers_match(run(per_layer, stacked, grads, steps=7), plain, name)
