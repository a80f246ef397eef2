"""The matrix-product FLOPs of a BERT layer equal the analytic count for its shapes."""

import jax
import jax.numpy as jnp
import pytest

from bert_flax import hlo
from bert_flax.hlo import classify
from bert_flax.model.config import BertConfig
from bert_flax.model.layers import BertLayer

L, H, HEADS = 32, 64, 4


@pytest.fixture(scope="module", params=[1, 2], ids=["batch1", "batch2"])
def batch_and_flops(request):
    """Batch 1 too: XLA then drops the batch dimension and the attention dots' metadata."""
    B = request.param
    cfg = BertConfig.preset(
        "tiny", hidden_size=H, num_heads=HEADS, intermediate_size=4 * H, num_layers=1
    )
    layer = BertLayer(cfg)
    x = jax.random.normal(jax.random.key(0), (B, L, H))
    segment_ids = jnp.ones((B, L), jnp.int32)
    params = layer.init(jax.random.key(1), x, segment_ids, None, True)

    def loss(params, x):
        return jnp.sum(layer.apply(params, x, segment_ids, None, True) ** 2)

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
    return B, out


def test_total_matmul_flops_are_three_times_the_forward_count(batch_and_flops):
    B, flops = batch_and_flops
    forward = 24 * B * L * H**2 + 4 * B * L**2 * H
    assert sum(flops.values()) == 3 * forward


@pytest.mark.parametrize(
    "op_class, forward_per_row",
    [
        ("qkv_projection", 3 * 2 * L * H * H),
        ("attention_output", 2 * L * H * H),
        ("feed_forward", 2 * 2 * L * H * 4 * H),
        ("attention_scores", 2 * L * L * H),
        ("attention_context", 2 * L * L * H),
    ],
)
def test_each_matmul_class_is_three_times_its_forward_count(
    batch_and_flops, op_class, forward_per_row
):
    B, flops = batch_and_flops
    assert flops.get(op_class) == 3 * B * forward_per_row
