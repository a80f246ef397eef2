"""Logical axis annotations and the rule table; a sharded forward/backward on 8 CPU devices
(sharded_gradients_worker.py)."""

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


@pytest.mark.slow(seconds=30)
def test_sharded_step_matches_single_device(run_on_devices):
    run_on_devices("tests.bert_flax.model.sharded_gradients_worker", 8)


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
