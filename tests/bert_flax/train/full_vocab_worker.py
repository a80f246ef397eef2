"""Run in a subprocess by test_train_sharding.py with 4 simulated CPU devices: one train step of
the tiny config with BERT's 30,522-word vocabulary on 1 device and with a 4-way model axis, and
the parameters unboxed by `sharding.unbox` and by `nn.unbox`. Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import conftest
import flax.linen as nn
import jax
import numpy as np

from bert_flax import sharding
from bert_flax.input_pipeline.synthetic import random_batch
from bert_flax.train.setup import create_train_setup


def main() -> dict:
    config = conftest.tiny_config(**{"train.batch_size": 8})
    config.model.vocab_size = 30522  # 30522 % 4 == 2: the vocab dim is replicated
    config.schedule.warmup_steps = 0
    out, key = {}, jax.random.key(0)
    for name, shape in (("one", (1, 1, 1)), ("four", (1, 1, 4))):
        config.mesh.shape = shape
        devices = jax.devices()[: int(np.prod(shape))]
        setup = create_train_setup(config, mesh=sharding.create_mesh(shape, devices=devices))
        batch = random_batch(8, setup.task.row_shape, vocab_size=30522, seed=2)
        state, metrics = setup.train_step(
            setup.state, sharding.global_batch(setup.mesh, batch), jax.random.key(0)
        )
        params = state.params
        table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
        kernel = params["bert"]["layer_0"]["ffn"]["intermediate"]["kernel"]
        out[name] = {
            "loss": float(metrics["loss"]),
            "table_spec": str(table.sharding.spec),
            "kernel_spec": str(kernel.sharding.spec),
            "table": np.asarray(jax.device_get(table))[:50].tolist(),
        }

    def init(k):
        return setup.model.init(k, batch, deterministic=True)

    shardings = sharding.param_shardings(jax.eval_shape(init, key), setup.mesh, setup.rules)
    boxed = jax.jit(init, out_shardings=shardings)(key)
    with sharding.partitioning(setup.mesh, setup.rules), jax.set_mesh(setup.mesh):
        unboxed = sharding.unbox(boxed)["params"]["bert"]["embeddings"]["word_embeddings"]
        out["unbox_spec"] = str(unboxed["embedding"].sharding.spec)
        try:
            nn.unbox(boxed)
            out["nn_unbox"] = "ok"
        except ValueError as error:  # jax's IndivisibleError
            out["nn_unbox"] = type(error).__name__
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
