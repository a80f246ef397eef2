"""Muon (optax's) on the hidden layers' matrices, AdamW elsewhere: the partition on a real BERT,
the orthogonalised update's flat spectrum, AdamW's first step on the rest, a training step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import optim
from bert_flax.config import BertConfig
from bert_flax.data import synthetic
from bert_flax.data.contract import RowShape
from bert_flax.model import BertForPreTraining
from optim.muon import muon_matrices


def tiny_bert_params():
    config = BertConfig.preset("tiny", vocab_size=256, relative_attention_buckets=8)
    batch = synthetic.random_batch(2, RowShape(32, 2, 4), vocab_size=256)
    model = BertForPreTraining(config)
    return model.init(jax.random.key(0), batch, deterministic=True)["params"], model, batch


def test_muon_takes_the_hidden_kernels_and_adamw_the_rest():
    params, _, _ = tiny_bert_params()
    flat = jax.tree_util.tree_flatten_with_path(
        muon_matrices(nn.unbox(params)), is_leaf=lambda x: x is None or isinstance(x, tuple)
    )[0]
    names = sorted(
        jax.tree_util.keystr(path).replace("['", "").replace("']", "/")
        for path, numbers in flat
        if numbers is not None
    )
    per_layer = ["attention/key", "attention/output", "attention/query", "attention/value",
                 "ffn/intermediate", "ffn/output"]  # fmt: skip
    expected = [f"bert/layer_{i}/{m}/kernel/" for i in range(2) for m in per_layer]
    expected += ["mlm_head/transform/kernel/", "nsp_head/pooler/kernel/"]
    assert names == sorted(expected)  # not embeddings, classifiers, biases, norms, bias table


def test_a_matrix_update_is_orthogonalised_and_the_rest_take_adamws_first_step():
    """A gradient with condition number 100 becomes an update whose singular values lie
    within 0.6..1.3 of their mean (Newton-Schulz's approximate polar factor, not exact);
    AdamW's first step on a bias is Nesterov Adam's (optax passes Muon's `nesterov` on):
    -lr * (1 + b1 (1 - b1) / (1 - b1^2)) * sign(g)."""
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.normal(size=(32, 32)))
    v, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    grad = (u[:, :16] * np.logspace(0, -2, 16)) @ v.T
    params = {"layer": {"kernel": jnp.zeros((32, 16)), "bias": jnp.zeros(16)}}
    grads = {"layer": {"kernel": jnp.asarray(grad, jnp.float32), "bias": jnp.linspace(-1, 1, 16)}}
    tx = optim.create("muon", learning_rate=0.1, weight_decay=0.0)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    singular = np.linalg.svd(np.asarray(updates["layer"]["kernel"]), compute_uv=False)
    assert 0.6 < singular.min() / singular.mean() and singular.max() / singular.mean() < 1.3
    gradient_singular = np.linalg.svd(grad, compute_uv=False)
    assert gradient_singular.max() / gradient_singular.min() > 90
    assert float(np.sum(np.asarray(updates["layer"]["kernel"]) * grad)) < 0  # a descent step
    bias = np.asarray(grads["layer"]["bias"])
    nesterov_first_step = 1 + 0.9 * 0.1 / (1 - 0.9**2)
    np.testing.assert_allclose(
        updates["layer"]["bias"], -0.1 * nesterov_first_step * np.sign(bias), rtol=1e-5
    )


@pytest.mark.slow(seconds=25)
def test_muon_trains_a_bert_step_on_boxed_params():
    params, model, batch = tiny_bert_params()
    tx = optim.create("muon", learning_rate=0.01)
    state = tx.init(params)

    def loss(p):
        output = model.apply({"params": p}, batch, deterministic=True)
        return jnp.mean(output.mlm_logits**2)

    grads = jax.grad(loss)(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    moved = jax.tree.leaves(jax.tree.map(lambda u: float(jnp.abs(u).max()), nn.unbox(updates)))
    assert all(np.isfinite(moved)) and max(moved) > 0
