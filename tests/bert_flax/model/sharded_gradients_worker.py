"""Run by test_model_sharding.py on 8 simulated CPU devices (`python -m
tests.bert_flax.model.sharded_gradients_worker`): the loss and gradients of a 1-layer BERT on one
device and on a 2 x 2 x 2 (data, fsdp, model) mesh agree, and the parameters are split as the
rules say; prints OK."""

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from bert_flax import sharding
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig
from bert_flax.model.losses import pretraining_loss


def packed_batch() -> dict[str, np.ndarray]:
    """4 rows of 32 tokens: two sequences (10 and 14 tokens) and 8 of padding each."""
    rng = np.random.default_rng(0)
    seg = np.repeat(np.array([[1] * 10 + [2] * 14 + [0] * 8]), 4, 0).astype(np.int32)
    return dict(
        input_ids=rng.integers(1, 97, (4, 32)).astype(np.int32) * (seg > 0),
        token_type_ids=np.zeros((4, 32), np.int32),
        segment_ids=seg,
        positions=np.where(seg == 2, np.arange(32) - 10, np.arange(32)) * (seg > 0),
        masked_lm_positions=np.tile(np.array([1, 3, 12, 20], np.int32), (4, 1)),
        masked_lm_ids=rng.integers(1, 97, (4, 4)).astype(np.int32),
        masked_lm_weights=np.ones((4, 4), np.float32),
        cls_positions=np.tile(np.array([0, 10], np.int32), (4, 1)),
        next_sentence_labels=np.array([[0, 1]] * 4, np.int32),
        sequence_mask=np.ones((4, 2), np.float32),
    )


def main() -> None:
    config = BertConfig(
        vocab_size=97, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=48,
        max_position_embeddings=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
    )  # fmt: skip
    batch = packed_batch()
    model = BertForPreTraining(config)

    def init(key):
        return model.init(key, batch, deterministic=True)

    def loss(params, b):
        return pretraining_loss(model.apply(params, b, deterministic=True), b)[0]

    step = jax.value_and_grad(loss)
    params = nn.unbox(jax.jit(init)(jax.random.key(0)))
    ref_loss, ref_grads = jax.jit(step)(params, batch)

    mesh = sharding.create_mesh((2, 2, 2))
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
        shardings = sharding.param_shardings(jax.eval_shape(init, jax.random.key(0)), mesh)
        sharded = sharding.unbox(jax.jit(init, out_shardings=shardings)(jax.random.key(0)))
        b = jax.device_put(batch, sharding.batch_sharding(mesh))
        s_loss, s_grads = jax.jit(step)(sharded, b)
    layer = sharded["params"]["bert"]["layer_0"]
    assert layer["ffn"]["intermediate"]["kernel"].sharding.spec == P("fsdp", "model")
    assert layer["attention"]["output"]["kernel"].sharding.spec == P("model", "fsdp")
    table = sharded["params"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert table.sharding.spec == P(None, "fsdp"), table.sharding  # 97 rows: not split
    np.testing.assert_allclose(s_loss, ref_loss, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), s_grads, ref_grads
    )
    print("OK")


if __name__ == "__main__":
    main()
