"""Model options: attention backends, bfloat16, pre-LN, rematerialisation, scanned layers,
dropout."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.model import bert as bert_model
from bert_flax.model import layers
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.losses import pretraining_loss

LENGTH, SLOTS, PREDICTIONS = 24, 3, 8


@pytest.fixture(scope="module")
def packed(sequences, make_batch):
    return make_batch([sequences[:2], sequences[2:]], LENGTH, SLOTS, PREDICTIONS)


@pytest.fixture(scope="module")
def variables(tiny_config, packed, random_variables):
    return random_variables(BertForPreTraining(tiny_config), packed)


def _apply(config, variables, batch, **kwargs):
    model = BertForPreTraining(config)
    return jax.jit(lambda v, b: model.apply(v, b, deterministic=True, **kwargs))(variables, batch)


@pytest.fixture(scope="module")
def reference(tiny_config, variables, packed):
    return _apply(tiny_config, variables, packed)


@pytest.mark.parametrize("impl", ["cudnn", "splash", "packed_tpu", "packed_gpu"])
def test_attention_backends_match_xla(impl, tiny_config, variables, sequences, make_batch):
    # On CPU "cudnn" runs jax.nn.dot_product_attention's XLA version, the kernels Pallas interpret.
    # The kernels need rows of a multiple of 128 tokens.
    batch = make_batch([sequences], 128, 4, 16)
    config = tiny_config.replace(attention_impl=impl, attention_dropout_rate=0.0)
    out, ref = _apply(config, variables, batch), _apply(tiny_config, variables, batch)
    for name in ("hidden_states", "mlm_logits", "nsp_logits"):
        np.testing.assert_allclose(getattr(out, name), getattr(ref, name), atol=2e-5)


def test_bfloat16_compute_close_to_float32(tiny_config, variables, packed, reference):
    out = _apply(tiny_config.replace(dtype="bfloat16"), variables, packed)
    assert out.hidden_states.dtype == jnp.bfloat16
    assert out.mlm_logits.dtype == out.nsp_logits.dtype == jnp.float32
    # Stated tolerance: logits within 3% of the float32 logits' range (measured 0.6% MLM, 1.2%
    # NSP), the loss within 0.5% (measured 6e-5).
    for name in ("mlm_logits", "nsp_logits"):
        ref = np.asarray(getattr(reference, name))
        err = np.abs(np.asarray(getattr(out, name)) - ref).max()
        assert err < 0.03 * np.abs(ref).max(), (name, err)
    loss_bf16 = pretraining_loss(out, packed)[0]
    loss_fp32 = pretraining_loss(reference, packed)[0]
    np.testing.assert_allclose(loss_bf16, loss_fp32, rtol=5e-3)


def test_params_stay_float32_under_bfloat16(tiny_config, packed):
    model = BertForPreTraining(tiny_config.replace(dtype="bfloat16"))
    shapes = jax.eval_shape(lambda b: model.init(jax.random.key(0), b, deterministic=True), packed)
    assert {x.dtype for x in jax.tree.leaves(nn.unbox(shapes))} == {jnp.dtype("float32")}


@pytest.mark.slow
def test_remat_gives_the_same_gradients(tiny_config, packed, random_variables):
    config = tiny_config.replace(num_layers=1)
    variables = random_variables(BertForPreTraining(config), packed)

    def grads(config):
        model = BertForPreTraining(config)

        def loss(v):
            return pretraining_loss(model.apply(v, packed, deterministic=True), packed)[0]

        return jax.jit(jax.grad(loss))(variables)

    plain, remat = grads(config), grads(config.replace(remat_policy="dots"))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), plain, remat)


@pytest.mark.parametrize("remat", ["none", "dots"])
def test_scanned_layers_equal_the_unrolled_ones(tiny_config, packed, random_variables, remat):
    """The same parameters, stacked: the same logits and, unstacked, the same gradients."""
    config = tiny_config.replace(num_layers=3, remat_policy=remat)
    variables = random_variables(BertForPreTraining(config), packed)
    scanned_config = config.replace(scan_layers=True)
    stacked = {"params": bert_model.stack_layers(variables["params"])}
    shapes = jax.eval_shape(
        lambda b: BertForPreTraining(scanned_config).init(jax.random.key(0), b, deterministic=True),
        packed,
    )
    assert jax.tree.map(np.shape, nn.unbox(shapes)) == jax.tree.map(np.shape, stacked)

    def grads(config, variables):
        model = BertForPreTraining(config)

        def loss(v):
            return pretraining_loss(model.apply(v, packed, deterministic=True), packed)[0]

        return jax.jit(jax.value_and_grad(loss))(variables)

    (loss, plain), (scanned_loss, scanned) = (
        grads(config, variables),
        grads(scanned_config, stacked),
    )
    np.testing.assert_allclose(scanned_loss, loss, rtol=1e-6)
    unstacked = {"params": bert_model.unstack_layers(scanned["params"])}
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), plain, unstacked
    )
    assert bert_model.match_layer_layout(variables["params"], stacked["params"]).keys() == (
        stacked["params"].keys()
    )


def test_scan_layers_rejects_block_sparse_layers(tiny_config):
    with pytest.raises(ValueError, match="scan_layers"):
        tiny_config.replace(scan_layers=True, block_sparse={"density": 0.5})


def test_pre_layer_norm_has_final_norm_and_runs(tiny_config, packed, random_variables):
    config = tiny_config.replace(pre_layer_norm=True)
    model = BertForPreTraining(config)
    variables = random_variables(model, packed)
    assert "final_layer_norm" in variables["params"]["bert"]
    out = _apply(config, variables, packed)
    assert np.isfinite(np.asarray(out.mlm_logits)).all()


def test_dropout_uses_the_dropout_rng(tiny_config, variables, packed, reference):
    model = BertForPreTraining(tiny_config.replace(hidden_dropout_rate=0.2))

    @jax.jit
    def run(key):
        return model.apply(variables, packed, deterministic=False, rngs={"dropout": key})

    a, b, c = run(jax.random.key(1)), run(jax.random.key(1)), run(jax.random.key(2))
    np.testing.assert_array_equal(a.mlm_logits, b.mlm_logits)
    assert not np.allclose(a.mlm_logits, c.mlm_logits)
    assert not np.allclose(a.mlm_logits, reference.mlm_logits)


def test_mask_free_dropout_equals_flax_dropout(tiny_config, variables, packed, monkeypatch):
    """The model's dropout (mask drawn again in the backward) gives flax's outputs and
    gradients bit for bit, with the same keys."""
    config = tiny_config.replace(hidden_dropout_rate=0.2, attention_dropout_rate=0.0)

    def loss_and_grads():
        model = BertForPreTraining(config)

        def loss(v):
            out = model.apply(v, packed, deterministic=False, rngs={"dropout": jax.random.key(3)})
            return pretraining_loss(out, packed)[0]

        return jax.jit(jax.value_and_grad(loss))(variables)

    ours = loss_and_grads()
    monkeypatch.setattr(layers, "Dropout", nn.Dropout)
    flax_dropout = loss_and_grads()
    jax.tree.map(np.testing.assert_array_equal, ours, flax_dropout)


def test_mask_free_dropout_keeps_no_mask_for_the_backward():
    x = jnp.ones((4, 16, 32))
    key = jax.random.key(0)

    def residuals(dropout):
        _, backward = jax.vjp(
            lambda x: dropout.apply({}, x, deterministic=False, rngs={"dropout": key}), x
        )
        return [r for r in jax.tree.leaves(backward) if getattr(r, "dtype", None) == jnp.bool_]

    assert residuals(nn.Dropout(0.1))  # flax keeps the [4, 16, 32] mask
    assert not residuals(layers.Dropout(0.1))
    grad = jax.grad(lambda x: layers.Dropout(0.1).apply(
        {}, x, deterministic=False, rngs={"dropout": key}).sum())(x)  # fmt: skip
    kept = np.asarray(grad) != 0
    np.testing.assert_allclose(np.asarray(grad)[kept], 1 / 0.9, rtol=1e-6)
    assert 0.85 < kept.mean() < 0.95


def test_attention_dropout_bits_reach_the_attention(tiny_config, variables, packed):
    """`attention_dropout_bits=8` changes the masks the model draws from the same key (only
    attention dropout on), and they are repeatable."""

    def run(bits: int):
        config = tiny_config.replace(
            hidden_dropout_rate=0.0, attention_dropout_rate=0.2, attention_dropout_bits=bits
        )
        model = BertForPreTraining(config)
        rngs = {"dropout": jax.random.key(1)}
        return model.apply(variables, packed, deterministic=False, rngs=rngs).mlm_logits

    byte_masked = run(8)
    np.testing.assert_array_equal(byte_masked, run(8))
    assert not np.allclose(byte_masked, run(32))
