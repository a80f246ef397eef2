"""A block-sparse tiny BERT: built through the Dense factory, trains with adam, checkpoints."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from bert_flax.block_sparse.bert import BlockSparseConfig
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.synthetic import random_batch
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig
from bert_flax.model.losses import pretraining_loss

VOCAB, LENGTH = 256, 32


def _model(num_layers=2, **block_sparse):
    config = BertConfig.preset(
        "tiny",
        num_layers=num_layers,
        vocab_size=VOCAB,
        max_position_embeddings=LENGTH,
        hidden_dropout_rate=0.0,
        attention_dropout_rate=0.0,
        block_sparse=block_sparse or None,
    )
    return BertForPreTraining(config)


def _batch(seed=0):
    batch = random_batch(4, RowShape(LENGTH, 2, 6), vocab_size=VOCAB, seed=seed)
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _ffn_params(params):
    layer = params["bert"]["layer_0"]["ffn"]
    return layer["intermediate"], layer["output"]


@pytest.fixture(scope="module")
def batch():
    return _batch()


def _find(params, name):
    return [v for k, v in jax.tree_util.tree_leaves_with_path(params) if name in str(k)]


def test_config_round_trip_and_validation():
    config = _model(density=0.25, block_size=16, roles=["ffn_intermediate"]).config
    assert isinstance(config.block_sparse, BlockSparseConfig)
    assert BertConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="roles"):
        BlockSparseConfig(roles=("pooler",))
    with pytest.raises(ValueError, match="Unknown block_sparse fields"):
        BlockSparseConfig.coerce({"sparsity": 0.9})


def _param_shapes(model, batch):
    init = lambda: nn.unbox(model.init(jax.random.key(0), batch, deterministic=True))["params"]
    return jax.eval_shape(init)


@pytest.mark.parametrize("wide", [False, True])
def test_sparse_layers_replace_the_selected_roles(batch, wide):
    dense_params = _param_shapes(_model(), batch)
    model = _model(density=0.25, block_size=32, wide=wide)
    params = _param_shapes(model, batch)
    intermediate, output = _ffn_params(params)
    assert set(intermediate) == {"blocks", "bias"} and set(output) == {"blocks", "bias"}
    attention = params["bert"]["layer_0"]["attention"]
    assert "kernel" in attention["query"]  # not selected: stays dense
    dense_ffn = sum(v["kernel"].size for v in _ffn_params(dense_params))
    sparse_ffn = intermediate["blocks"].size + output["blocks"].size
    if wide:  # 4x wider intermediate at 25% density: the dense parameter count
        assert intermediate["bias"].shape == (4 * model.config.intermediate_size,)
        assert sparse_ffn == dense_ffn
    else:
        assert sparse_ffn == dense_ffn // 4


@pytest.mark.slow(seconds=25)  # ~30 s on 2 busy cores, mostly compiling
def test_block_sparse_bert_trains_and_checkpoints(batch, tmp_path):
    model = _model(
        num_layers=1,
        density=0.25,
        block_size=16,
        layout="watts_strogatz",
        roles=["query", "key", "value", "attention_output", "ffn_intermediate", "ffn_output"],
    )
    init = jax.jit(lambda key: nn.unbox(model.init(key, batch, deterministic=True))["params"])
    params = init(jax.random.key(0))
    assert len(_find(params, "blocks")) == 6
    tx = optax.adam(3e-3)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state):
        def loss_fn(p):
            out = model.apply({"params": p}, batch, deterministic=True)
            return pretraining_loss(out, batch)[0]

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(30):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", params)
    checkpointer.wait_until_finished()
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, params)
    restored = checkpointer.restore(tmp_path / "ckpt", abstract)
    jax.tree_util.tree_map(np.testing.assert_array_equal, restored, params)
    logits = jax.jit(lambda p: model.apply({"params": p}, batch, deterministic=True).mlm_logits)
    np.testing.assert_array_equal(logits(restored), logits(params))
