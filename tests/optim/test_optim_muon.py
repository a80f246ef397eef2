"""Muon (optax's) on the hidden layers' matrices, AdamW elsewhere: the partition on a real BERT,
the orthogonalised update's flat spectrum, AdamW's first step on the rest, and a BERT's first
update against an SVD reference (Muon) and AdamW's closed form (the rest)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import traverse_util

import optim
from bert_flax.input_pipeline import synthetic
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig
from optim.muon import muon_matrices


def tiny_bert_params():
    config = BertConfig.preset("tiny", vocab_size=256, relative_attention_buckets=8)
    batch = synthetic.random_batch(2, RowShape(32, 2, 4), vocab_size=256)
    model = BertForPreTraining(config)
    init = jax.jit(lambda b: model.init(jax.random.key(0), b, deterministic=True))
    return init(batch)["params"], model, batch


def flat(tree: dict) -> dict[str, Any]:
    """`tree`'s leaves (unboxed) by path, "bert/layer_0/ffn/output/kernel"."""
    return traverse_util.flatten_dict(nn.unbox(tree), sep="/")


_PER_LAYER = ("attention/key", "attention/output", "attention/query", "attention/value",
              "ffn/intermediate", "ffn/output")  # fmt: skip
HIDDEN_KERNELS = sorted(
    [f"bert/layer_{i}/{m}/kernel" for i in range(2) for m in _PER_LAYER]
    + ["mlm_head/transform/kernel", "nsp_head/pooler/kernel"]
)  # the tiny BERT's Muon matrices: not embeddings, classifiers, biases, norms, bias table


def test_muon_takes_the_hidden_kernels_and_adamw_the_rest():
    params, _, _ = tiny_bert_params()
    numbers = flat(muon_matrices(nn.unbox(params)))
    assert sorted(name for name, n in numbers.items() if n is not None) == HIDDEN_KERNELS


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


NS_COEFFS = (3.4445, -4.7750, 2.0315)  # Jordan's quintic Newton-Schulz step (optax's default)


def newton_schulz_by_svd(grad: np.ndarray, steps: int = 5) -> np.ndarray:
    """Muon's orthogonalisation of `grad` from its SVD: the quintic acts on each singular value
    of the Frobenius-normalised matrix, so five steps give U f(S / |S|) V^T, f(s) near 1."""
    u, s, vt = np.linalg.svd(grad.astype(np.float64), full_matrices=False)
    s = s / np.linalg.norm(s)
    a, b, c = NS_COEFFS
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return (u * s) @ vt


def test_a_bert_step_orthogonalises_the_hidden_kernels_and_adamw_steps_the_rest():
    """On boxed BERT parameters, the first update of each Muon matrix is -lr times the
    SVD reference scaled to RMS 0.2 (optax's consistent RMS: 0.2 sqrt(max(m, n))); every other
    parameter takes AdamW's first (Nesterov) step, -lr c g / (|g| + eps)."""
    params, model, batch = tiny_bert_params()
    lr, eps = 0.01, 1e-8
    tx = optim.create("muon", learning_rate=lr, weight_decay=0.0)

    def loss(p):
        output = model.apply({"params": p}, batch, deterministic=True)
        return jnp.mean(output.mlm_logits**2) + jnp.mean(output.nsp_logits**2)

    grads = jax.jit(jax.grad(loss))(params)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    grads, updates = flat(grads), flat(updates)
    nesterov_first_step = 1 + 0.9 * 0.1 / (1 - 0.9**2)
    for name, grad in grads.items():
        grad = np.asarray(grad)
        if name in HIDDEN_KERNELS:
            assert np.linalg.norm(grad) > 0, name
            expected = -lr * 0.2 * np.sqrt(max(grad.shape)) * newton_schulz_by_svd(grad)
        else:
            expected = -lr * nesterov_first_step * grad / (np.abs(grad) + eps)
        np.testing.assert_allclose(updates[name], expected, atol=1e-5, err_msg=name)
