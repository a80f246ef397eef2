"""The matrix-product FLOPs of a BERT layer equal the analytic count for its shapes."""

import jax
import jax.numpy as jnp
import pytest

from bert_flax.config import BertConfig
from bert_flax.layers import BertLayer
from bert_flax.profile import classify, hlo

B, L, H, HEADS = 2, 32, 64, 4


@pytest.fixture(scope="module")
def matmul_flops_by_class():
    cfg = BertConfig.preset(
        "tiny", hidden_size=H, num_heads=HEADS, intermediate_size=4 * H, num_layers=1
    )
    layer = BertLayer(cfg)
    x = jax.random.normal(jax.random.key(0), (B, L, H))
    segment_ids = jnp.ones((B, L), jnp.int32)
    params = layer.init(jax.random.key(1), x, segment_ids, True)

    def loss(params, x):
        return jnp.sum(layer.apply(params, x, segment_ids, True) ** 2)

    grad = jax.grad(loss, argnums=(0, 1))  # input gradient too: backward = 2 x forward
    module = hlo.parse_module(jax.jit(grad).lower(params, x).compile().as_text())
    executed = module.executed_ops()
    classes = classify.Classifier(module).classify(executed)
    out = {}
    for e in executed:
        c = classes[e.instruction.name].op_class
        if c in classify.MATMUL_CLASSES:
            out[c] = out.get(c, 0.0) + hlo.op_cost(module, e.instruction).matmul_flops * (
                e.count or 1
            )
    return out


def test_total_matmul_flops_are_three_times_the_forward_count(matmul_flops_by_class):
    forward = 24 * B * L * H**2 + 4 * B * L**2 * H
    assert sum(matmul_flops_by_class.values()) == 3 * forward


@pytest.mark.parametrize(
    "op_class, forward",
    [
        ("qkv_projection", 3 * 2 * B * L * H * H),
        ("attention_output", 2 * B * L * H * H),
        ("feed_forward", 2 * 2 * B * L * H * 4 * H),
        ("attention_scores", 2 * B * L * L * H),
        ("attention_context", 2 * B * L * L * H),
    ],
)
def test_each_matmul_class_is_three_times_its_forward_count(
    matmul_flops_by_class, op_class, forward
):
    assert matmul_flops_by_class.get(op_class) == 3 * forward
