"""Logical axis annotations and the rule table; a sharded forward/backward on 8 CPU devices."""

import textwrap

import flax.linen as nn
import jax
import pytest

from bert_flax import sharding
from bert_flax.model.bert import BertForPreTraining


def test_every_param_is_annotated_with_known_axes(tiny_config, sequences, make_batch):
    batch = make_batch([sequences], 48, 4, 16)
    model = BertForPreTraining(tiny_config.replace(pre_layer_norm=True))
    boxed = jax.eval_shape(lambda b: model.init(jax.random.key(0), b, deterministic=True), batch)
    specs = jax.tree_util.tree_leaves_with_path(
        nn.get_partition_spec(boxed), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    )
    shapes = jax.tree.leaves(nn.unbox(boxed))
    known = {name for name, _ in sharding.LOGICAL_AXIS_RULES}
    for (path, spec), shape in zip(specs, shapes):
        assert len(spec) == len(shape.shape), jax.tree_util.keystr(path)
        assert all(name in known for name in spec), (jax.tree_util.keystr(path), spec)


_WORKER = textwrap.dedent(
    """
    import jax, numpy as np, flax.linen as nn
    from jax.sharding import PartitionSpec as P
    from bert_flax import sharding
    from bert_flax.model.config import BertConfig
    from bert_flax.model.losses import pretraining_loss
    from bert_flax.model.bert import BertForPreTraining

    config = BertConfig(vocab_size=97, hidden_size=32, num_layers=1, num_heads=4,
                        intermediate_size=48, max_position_embeddings=32,
                        hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    rng = np.random.default_rng(0)
    seg = np.repeat(np.array([[1] * 10 + [2] * 14 + [0] * 8]), 4, 0).astype(np.int32)
    pos = np.where(seg == 2, np.arange(32) - 10, np.arange(32)) * (seg > 0)
    batch = dict(
        input_ids=rng.integers(1, 97, (4, 32)).astype(np.int32) * (seg > 0),
        token_type_ids=np.zeros((4, 32), np.int32), segment_ids=seg, positions=pos,
        masked_lm_positions=np.tile(np.array([1, 3, 12, 20], np.int32), (4, 1)),
        masked_lm_ids=rng.integers(1, 97, (4, 4)).astype(np.int32),
        masked_lm_weights=np.ones((4, 4), np.float32),
        cls_positions=np.tile(np.array([0, 10], np.int32), (4, 1)),
        next_sentence_labels=np.array([[0, 1]] * 4, np.int32),
        sequence_mask=np.ones((4, 2), np.float32))
    model = BertForPreTraining(config)
    init = lambda k: model.init(k, batch, deterministic=True)

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
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 s_grads, ref_grads)
    print("OK")
    """
)


@pytest.mark.slow(seconds=30)
def test_sharded_step_matches_single_device(run_on_devices):
    run_on_devices(_WORKER, 8)


def test_rules_from_config_round_trips_the_table_and_names_bad_entries():
    assert tuple(sharding.rules_from_config(sharding.rules_config())) == tuple(
        sharding.LOGICAL_AXIS_RULES
    )
    moved = dict(sharding.rules_from_config({**sharding.rules_config(), "vocab": ("fsdp",)}))
    assert moved["vocab"] == "fsdp" and moved["embed"] == "fsdp"
    with pytest.raises(ValueError, match=r"rules.vocab=\('tensor',\).*not mesh axes"):
        sharding.rules_from_config({"vocab": ("tensor",)})
    with pytest.raises(ValueError, match=r"rules\.embd: not a logical axis"):
        sharding.rules_from_config({"embd": ()})
    with pytest.raises(ValueError, match=r"config\.mesh\.shape instead"):
        sharding.rules_from_config({sharding.BATCH: ("data",)})
