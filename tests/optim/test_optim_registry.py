"""optim.create, the weight-decay mask, the packing beta adjustment and the no-op host hooks."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import linen as nn

import optim

BERT_LIKE_PARAMS = {
    "embeddings": {
        "word_embeddings": {"embedding": jnp.ones((10, 4))},
        "embeddings_layer_norm": {"scale": jnp.ones(4), "bias": jnp.zeros(4)},
    },
    "layer_0": {
        "attention": {"query": {"kernel": jnp.ones((4, 4)), "bias": jnp.zeros(4)}},
        "LayerNorm": {"gamma": jnp.ones(4), "beta": jnp.zeros(4)},
        "ffn": {"kernel": jnp.ones((4, 8))},
    },
}


def test_weight_decay_mask_excludes_norms_and_biases():
    mask = optim.weight_decay_mask(BERT_LIKE_PARAMS)
    assert mask == {
        "embeddings": {
            "word_embeddings": {"embedding": True},
            "embeddings_layer_norm": {"scale": False, "bias": False},
        },
        "layer_0": {
            "attention": {"query": {"kernel": True, "bias": False}},
            "LayerNorm": {"gamma": False, "beta": False},
            "ffn": {"kernel": True},
        },
    }


def test_weight_decay_mask_on_a_flax_model_with_partitioned_params():
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            init = nn.with_logical_partitioning(nn.initializers.ones, ("embed", "mlp"))
            x = nn.Dense(3, kernel_init=init, name="dense")(x)
            return nn.LayerNorm(name="output_layer_norm")(x)

    params = Block().init(jax.random.key(0), jnp.ones((1, 2)))["params"]
    mask = optim.weight_decay_mask(params)
    assert jax.tree.leaves(mask["dense"]) == [False, True]  # bias, kernel (boxed)
    assert jax.tree.leaves(mask["output_layer_norm"]) == [False, False]


def test_adjust_betas_for_packing():
    b1, b2 = optim.adjust_betas_for_packing(0.9, 0.999, 2.0)
    np.testing.assert_allclose([b1, b2], [0.81, 0.999**2])
    assert optim.adjust_betas_for_packing(0.9, 0.999, 1.0) == (0.9, 0.999)
    with pytest.raises(ValueError, match="packing_factor"):
        optim.adjust_betas_for_packing(0.9, 0.999, 0.5)
    with pytest.raises(ValueError, match="b2"):
        optim.adjust_betas_for_packing(0.9, 1.5, 2.0)


@pytest.mark.parametrize("name", ["sgd", "adamw", "lamb", "muon"])
def test_create_from_name_and_config_agree(name):
    params = {"w": jnp.arange(6.0).reshape(2, 3), "bias": jnp.ones(3)}
    grads = jax.tree.map(lambda p: 0.1 * p + 1.0, params)
    config = ml_collections.ConfigDict({"name": name, "learning_rate": 0.1})
    for tx in (optim.create(name, learning_rate=0.1), optim.create(config)):
        updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
        np.testing.assert_array_less(jnp.sum(updates["w"] * grads["w"]), 0.0)  # a descent step
        assert optim.after_step(tx, "state", 3) == "state"
        assert optim.host_metrics(tx, None) == {}


def numpy_lamb(params, grads_per_step, lr, b1, b2, eps, weight_decay, decayed):
    """LAMB (You et al., 2019, Algorithm 2) written out in float64 numpy, one leaf = one layer.

    Adam moments with bias correction, r = m_hat / (sqrt(v_hat) + eps) + wd * w on decayed
    leaves, trust ratio ||w|| / ||r|| (1 when either norm is 0, as optax does), step
    -lr(t) * ratio * r. Returns the parameters after each step.
    """
    w = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    history = []
    for t, grads in enumerate(grads_per_step):
        for k in w:
            g = np.asarray(grads[k], np.float64)
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat = m[k] / (1 - b1 ** (t + 1))
            v_hat = v[k] / (1 - b2 ** (t + 1))
            r = m_hat / (np.sqrt(v_hat) + eps)
            if decayed[k]:
                r = r + weight_decay * w[k]
            w_norm, r_norm = np.linalg.norm(w[k]), np.linalg.norm(r)
            ratio = 1.0 if w_norm == 0 or r_norm == 0 else w_norm / r_norm
            w[k] = w[k] - lr(t) * ratio * r
        history.append({k: x.copy() for k, x in w.items()})
    return history


def test_lamb_follows_its_formula_with_the_weight_decay_mask():
    rng = np.random.default_rng(0)
    params = {
        "kernel": rng.normal(size=(3, 4)),  # decayed
        "bias": rng.normal(size=4),  # not decayed (its name)
        "layer_norm_scale": 1.0 + 0.1 * rng.normal(size=4),  # not decayed (a norm's)
        "embedding": np.zeros((5, 2)),  # decayed, but ||w|| = 0: trust ratio 1
        "unused_bias": rng.normal(size=3),  # gradient always 0, not decayed: ||r|| = 0, ratio 1
    }
    tree = {
        "dense": {"kernel": "kernel", "bias": "bias"},
        "LayerNorm": {"scale": "layer_norm_scale"},
        "word_embeddings": {"embedding": "embedding"},
        "unused": {"bias": "unused_bias"},
    }
    to_tree = lambda flat: jax.tree.map(lambda k: jnp.asarray(flat[k], jnp.float32), tree)
    grads = []
    for step in range(5):
        g = {k: rng.normal(scale=1.0 + step, size=p.shape) for k, p in params.items()}
        g["unused_bias"] = np.zeros(3)
        grads.append(g)
    decayed = {
        "kernel": True,
        "bias": False,
        "layer_norm_scale": False,
        "embedding": True,
        "unused_bias": False,
    }
    lr = lambda t: 0.1 * min(t + 1, 3) / 3  # a warm-up, evaluated at optax's count t
    hp = {"b1": 0.8, "b2": 0.95, "eps": 1e-3, "weight_decay": 0.3}
    expected = numpy_lamb(params, grads, lr, decayed=decayed, **hp)

    tx = optim.create(
        "lamb", learning_rate=optax.linear_schedule(0.1 / 3, 0.1, 2), **hp
    )  # default mask: optim.weight_decay_mask
    w = to_tree(params)
    state = tx.init(w)
    update = jax.jit(tx.update)
    for t, g in enumerate(grads):
        updates, state = update(to_tree(g), state, w)
        w = optax.apply_updates(w, updates)
        got = {k: np.asarray(w[a][b]) for a, sub in tree.items() for b, k in sub.items()}
        for k, value in expected[t].items():
            np.testing.assert_allclose(got[k], value, rtol=2e-5, atol=1e-6, err_msg=f"{k} @ {t}")
    # The reference is not vacuous: each leaf with a gradient or decay moved, and decay mattered.
    assert all(not np.allclose(expected[-1][k], params[k]) for k in params if k != "unused_bias")
    np.testing.assert_array_equal(expected[-1]["unused_bias"], params["unused_bias"])
    no_decay = numpy_lamb(params, grads, lr, decayed=dict.fromkeys(decayed, False), **hp)
    assert not np.allclose(no_decay[-1]["kernel"], expected[-1]["kernel"], rtol=1e-3)
    assert np.allclose(no_decay[-1]["bias"], expected[-1]["bias"])


def test_grad_clip_norm_clips_first():
    params = {"w": jnp.zeros(4)}
    tx = optim.create("sgd", learning_rate=1.0, momentum=0.0, grad_clip_norm=1.0)
    updates, _ = tx.update({"w": jnp.full(4, 10.0)}, tx.init(params), params)
    np.testing.assert_allclose(jnp.linalg.norm(updates["w"]), 1.0, rtol=1e-6)


def test_create_rejects_bad_input_clearly():
    with pytest.raises(ValueError, match="Unknown optimizer 'adam'"):
        optim.create("adam", learning_rate=1.0)
    with pytest.raises(ValueError, match=r"Unknown hyperparameters \['beta1'\]"):
        optim.create("lamb", learning_rate=1.0, beta1=0.9)
    with pytest.raises(ValueError, match="needs a learning_rate"):
        optim.create("lamb")
    with pytest.raises(ValueError, match="no `name`"):
        optim.create({"learning_rate": 1.0})


def test_config_section_holds_every_optimizer_at_its_builders_defaults():
    section = optim.config_section("adamw")
    assert section.name == "adamw" and set(optim.OPTIMIZERS) <= set(section)
    assert section.shampoo.block_size == 128 and section.shampoo.max_staleness is None
    assert section.lamb.to_dict() == {"b1": 0.9, "b2": 0.999, "eps": 1e-6, "weight_decay": 0.01}
    section.shampoo.max_staleness = 50  # a placeholder takes its annotated type
    with pytest.raises(TypeError):
        section.shampoo.max_staleness = "fifty"


@pytest.mark.parametrize("name", sorted(optim.OPTIMIZERS))
def test_create_from_a_sectioned_config_uses_that_section_only(name):
    section = optim.config_section(name)
    settings_name, settings = optim.settings_of(section)
    assert settings_name == name
    expected = {k: v for k, v in section[name].to_dict().items() if v is not None}
    assert settings == expected  # other optimizers' sections are dropped
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    tx = optim.create(section, learning_rate=0.1)
    updates, _ = jax.jit(tx.update)(params, tx.init(params), params)
    assert jax.tree.leaves(updates)[0].shape == (2, 3)


def test_a_section_value_reaches_the_optimizer():
    section = optim.config_section("sgd")
    section.sgd.momentum = 0.0
    params, grads = {"w": jnp.zeros(3)}, {"w": jnp.ones(3)}
    tx = optim.create(section, learning_rate=1.0)
    state = tx.init(params)
    for _ in range(2):  # without momentum the second step equals the first
        updates, state = tx.update(grads, state, params)
        np.testing.assert_allclose(updates["w"], -1.0)
