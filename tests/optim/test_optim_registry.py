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


@pytest.mark.parametrize("name", ["sgd", "adamw", "lamb"])
def test_create_from_name_and_config_agree(name):
    params = {"w": jnp.arange(6.0).reshape(2, 3), "bias": jnp.ones(3)}
    grads = jax.tree.map(lambda p: 0.1 * p + 1.0, params)
    config = ml_collections.ConfigDict({"name": name, "learning_rate": 0.1})
    for tx in (optim.create(name, learning_rate=0.1), optim.create(config)):
        updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
        np.testing.assert_array_less(jnp.sum(updates["w"] * grads["w"]), 0.0)  # a descent step
        assert optim.after_step(tx, "state", 3) == "state"
        assert optim.host_metrics(tx, None) == {}


def test_lamb_matches_optax_with_bert_defaults_and_mask():
    params = {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)}}
    grads = jax.tree.map(lambda p: 0.5 * jnp.ones_like(p), params)
    schedule = optax.linear_schedule(0.0, 1e-2, 10)
    ours = optim.create("lamb", learning_rate=schedule)
    mask = {"dense": {"kernel": True, "bias": False}}
    ref = optax.lamb(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=mask)
    state_ours, state_ref = ours.init(params), ref.init(params)
    for _ in range(3):
        upd_ours, state_ours = ours.update(grads, state_ours, params)
        upd_ref, state_ref = ref.update(grads, state_ref, params)
        jax.tree.map(np.testing.assert_allclose, upd_ours, upd_ref)


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
