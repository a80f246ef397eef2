"""Small programs with known contents land in their operation class."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest

from bert_flax import hlo, profile
from bert_flax.hlo import classify


def class_flops(fn, *args, vocab_size=None):
    """FLOPs and op count per class of fn's compiled program (no trace needed)."""
    module = hlo.parse_module(jax.jit(fn).lower(*args).compile().as_text())
    executed = module.executed_ops()
    classes = classify.Classifier(module, vocab_size=vocab_size).classify(executed)
    out = {}
    for e in executed:
        c = classes[e.instruction.name].op_class
        cost = hlo.op_cost(module, e.instruction)
        flops, n = out.get(c, (0.0, 0))
        out[c] = (flops + cost.flops * (e.count or 1), n + 1)
    return out


def dominant(fn, *args, **kw):
    by_class = class_flops(fn, *args, **kw)
    return max(by_class, key=lambda c: by_class[c][0])


x = jax.random.normal(jax.random.key(0), (8, 64, 128))


def test_lone_matmul_is_a_matmul():
    w = jnp.ones((128, 256))
    assert dominant(lambda x, w: x @ w, x, w) in profile.MATMUL_CLASSES


def test_lone_layer_norm_is_normalisation():
    ln = nn.LayerNorm()
    params = ln.init(jax.random.key(0), x)
    assert set(class_flops(lambda p, x: ln.apply(p, x), params, x)) == {"normalization"}


def test_plain_layer_norm_math_is_normalisation():
    def layer_norm(x):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6)

    assert dominant(layer_norm, x) == "normalization"


@pytest.mark.parametrize("approximate", [False, True])
def test_fused_gelu_is_an_activation(approximate):
    assert (
        dominant(lambda x: jax.nn.gelu(x * 1.5 + 0.5, approximate=approximate), x) == "activation"
    )


def test_softmax_is_softmax():
    assert dominant(lambda s: jax.nn.softmax(s, axis=-1), x) == "softmax"


def test_dropout_is_dropout():
    drop = nn.Dropout(0.1)
    fn = lambda x, r: drop.apply({}, x, deterministic=False, rngs={"dropout": r})
    assert dominant(fn, x, jax.random.key(3)) == "dropout"


def test_embedding_gather_is_embedding():
    embed = nn.Embed(1000, 32)
    params = embed.init(jax.random.key(0), jnp.zeros((4, 16), jnp.int32))
    ids = jnp.arange(64, dtype=jnp.int32).reshape(4, 16)
    assert set(class_flops(lambda p, i: embed.apply(p, i), params, ids)) <= {"embedding"}


def test_residual_add_is_residual():
    assert set(class_flops(lambda a, b: a + b, x, x * 2)) == {"residual"}


def test_transpose_copy_is_data_movement():
    assert set(class_flops(lambda a: jnp.transpose(a, (2, 0, 1)) * 1, x)) <= {"data_movement"}


def test_update_after_the_gradient_is_the_optimizer():
    w = jnp.ones((128, 64))
    tx = optax.adam(1e-3)

    def step(w, opt_state, x):
        g = jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)
        updates, opt_state = tx.update(g, opt_state)
        return optax.apply_updates(w, updates), opt_state

    by_class = class_flops(step, w, tx.init(w), x)
    assert "optimizer" in by_class
    matmul = sum(f for c, (f, _) in by_class.items() if c in profile.MATMUL_CLASSES)
    assert matmul == 2 * 2 * 8 * 64 * 128 * 64  # forward and weight-gradient products


def test_vocabulary_sized_product_is_the_mlm_head():
    w = jnp.ones((128, 997))
    assert dominant(lambda x, w: x @ w, x, w, vocab_size=997) == "mlm_head"


def test_op_name_parts_strip_transform_wrappers():
    tokens, primitive = classify.op_name_parts(
        "jit(step)/transpose(jvp(Model))/bert/layer_0/attention/query/dot_general"
    )
    assert tokens == ["bert", "layer_0", "attention", "query"] and primitive == "dot_general"


def test_products_after_the_gradient_are_the_optimizers_matmuls():
    w = jnp.ones((128, 64))

    def step(w, statistics, x):  # Shampoo-like: statistics G G^T, then the update L G
        g = jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)
        statistics = statistics + g @ g.T
        return w - 1e-3 * (statistics @ g), statistics

    by_class = class_flops(step, w, jnp.zeros((128, 128)), x)
    assert by_class["optimizer_matmul"][0] == 2 * (2 * 128 * 64 * 128)  # G G^T and L G
    assert "optimizer_matmul" in profile.MATMUL_CLASSES
