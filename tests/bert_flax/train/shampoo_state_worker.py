"""Run in a subprocess by test_train_sharding.py with 8 simulated CPU devices: the shardings of
Shampoo's state for one FFN kernel on a 2 x 2 x 2 (data, fsdp, model) mesh, planned and after a
train step. Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import conftest
import jax

import optim
from bert_flax import sharding
from bert_flax.input_pipeline.synthetic import random_batch
from bert_flax.train.setup import create_train_setup

KERNEL = ("bert", "layer_0", "ffn", "intermediate", "kernel")


def shampoo_state(opt_state) -> optim.ShampooState:
    """The one ShampooState in `opt_state`."""
    is_state = lambda x: isinstance(x, optim.ShampooState)
    found = [x for x in jax.tree_util.tree_leaves(opt_state, is_leaf=is_state) if is_state(x)]
    assert len(found) == 1, opt_state
    return found[0]


def kernel_entry(tree):
    for key in KERNEL:
        tree = tree[key]
    return tree


def main() -> dict:
    config = conftest.tiny_config(**{"train.batch_size": 8})
    config.optimizer.name = "shampoo"
    config.optimizer.shampoo.update(
        block_size=16, start_preconditioning_step=1, preconditioning_compute_steps=1
    )
    config.mesh.shape = (2, 2, 2)
    setup = create_train_setup(config)
    planned = kernel_entry(shampoo_state(setup.state_shardings.opt_state).tensors)
    param = kernel_entry(setup.state_shardings.params)
    batch = random_batch(8, setup.task.row_shape, vocab_size=512, seed=1)
    state, metrics = setup.train_step(
        setup.state, sharding.global_batch(setup.mesh, batch), jax.random.key(0)
    )
    live = kernel_entry(shampoo_state(state.opt_state).tensors)
    return {
        "param": str(param.spec),
        "momentum": str(planned.momentum.spec),
        "graft": str(planned.graft.spec),
        "stats": [str(s.spec) for s in planned.factor_stats],
        "live_momentum": str(live.momentum.sharding.spec),
        "loss": float(metrics["loss"]),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
