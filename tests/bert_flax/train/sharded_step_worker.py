"""Run in a subprocess by test_train_sharding.py with 8 simulated CPU devices (JAX_NUM_CPU_DEVICES):
one train step on a 4 x 2 (data x model) mesh and on 1 device, same config, seed and batch; and
on the 4 x 2 mesh with the rules that use the model axis overridden to replicate
(`config.mesh.rules`). Prints one JSON line with the differences."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import conftest
import jax
import numpy as np
from jax.sharding import AxisType

from bert_flax import sharding
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.synthetic import random_batch
from bert_flax.train.setup import create_train_setup


def run(mesh, config, batch):
    setup = create_train_setup(config, mesh=mesh)
    init = jax.device_get(setup.state.params)
    state, metrics = setup.train_step(
        setup.state, sharding.global_batch(mesh, batch), jax.random.key(3)
    )
    kernel_specs = {
        str(leaf.sharding.spec)
        for leaf in jax.tree_util.tree_leaves(state.params)
        if leaf.ndim == 2
    }
    return init, jax.device_get(state.params), jax.device_get(metrics), kernel_specs


def max_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(x - y)))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def main():
    assert jax.device_count() == 8, jax.devices()
    batch = random_batch(16, RowShape(32, 3, 8), vocab_size=512, seed=5)

    def config(accumulation, replicate_over_model=False):
        c = conftest.tiny_config(**{"train.batch_size": 16, "train.accumulation": accumulation})
        c.mesh.shape = (4, 1, 2)
        if replicate_over_model:  # no tensor parallelism: the model axis only replicates
            for logical, axes in c.mesh.rules.items():
                if axes == ("model",):
                    c.mesh.rules[logical] = ()
        c.schedule.warmup_steps = 0  # a non-zero learning rate at step 0
        return c

    one = jax.make_mesh(
        (1, 1, 1),
        ("data", "fsdp", "model"),
        axis_types=(AxisType.Auto,) * 3,
        devices=jax.devices()[:1],
    )
    eight = sharding.mesh_of(config(1).mesh)
    init1, params1, metrics1, _ = run(one, config(1), batch)
    out = {"param_change": max_diff(init1, params1), "loss_1": float(metrics1["loss"])}
    cases = {"m1": config(1), "m2": config(2), "no_model_rules": config(1, True)}
    for case, case_config in cases.items():
        init8, params8, metrics8, specs8 = run(eight, case_config, batch)
        out[case] = {
            "init_diff": max_diff(init1, init8),
            "param_diff": max_diff(params1, params8),
            "loss": float(metrics8["loss"]),
            "grad_norm_ratio": float(metrics8["grad_norm"] / metrics1["grad_norm"]),
            "kernel_specs": sorted(specs8),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
