"""BertConfig presets and validation; parameter counts against the published BERT sizes."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_flax.input_pipeline.contract import PRETRAINING_INPUTS
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig

# (layers, hidden, heads) of the original BERT and of Turc et al. (2019) compact models.
PUBLISHED_SHAPES = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def _count(config):
    batch = {name: jax.ShapeDtypeStruct((1, 1), np.int32) for name in PRETRAINING_INPUTS}
    model = BertForPreTraining(config)
    shapes = jax.eval_shape(lambda b: model.init(jax.random.key(0), b, deterministic=True), batch)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes)))


@pytest.mark.parametrize("name", sorted(PUBLISHED_SHAPES))
def test_presets_have_published_shapes(name):
    config = BertConfig.preset(name)
    layers, hidden, heads = PUBLISHED_SHAPES[name]
    assert (config.num_layers, config.hidden_size, config.num_heads) == (layers, hidden, heads)
    assert config.intermediate_size == 4 * hidden and config.vocab_size == 30522


def test_base_parameter_count():
    # bert-base-uncased: 109,482,240 encoder + pooler parameters, plus the pre-training heads
    # (transform 768x768+768, LayerNorm 2x768, output bias 30,522, NSP 768x2+2).
    heads = 768 * 768 + 768 + 2 * 768 + 30522 + 768 * 2 + 2
    assert _count(BertConfig.preset("base")) == 109_482_240 + heads


def test_overrides_dict_round_trip_and_validation():
    config = BertConfig.preset("tiny", vocab_size=1000, dtype="bfloat16", attention_impl="xla")
    assert config.vocab_size == 1000 and config.dtype == np.dtype("bfloat16")
    assert BertConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="Unknown BERT preset"):
        BertConfig.preset("huge")
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        BertConfig.preset("tiny", num_heads=3)
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig.preset("tiny", hidden_act="tanh")
    with pytest.raises(ValueError, match="Unknown BertConfig fields"):
        BertConfig.from_dict({"hidden": 3})


def test_missing_feature_is_named(tiny_config):
    batch = {name: np.zeros((1, 4), np.int32) for name in PRETRAINING_INPUTS if name != "positions"}
    with pytest.raises(KeyError, match="positions"):
        BertForPreTraining(tiny_config).init(jax.random.key(0), batch, deterministic=True)
