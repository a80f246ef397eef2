"""Run by test_train_multihost.py: process `process_id` of `num_processes` (jax.distributed on
localhost, one CPU device each) feeds its rows of one global batch to the configured train step
and prints the loss and a parameter checksum as JSON. With num_processes=1 it is the reference."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import conftest
import jax
import numpy as np

from bert_flax import sharding
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.synthetic import random_batch
from bert_flax.train import loop
from bert_flax.train.setup import create_train_setup

ROWS = 8


def main():
    process_id, num_processes, port = (int(a) for a in sys.argv[1:4])
    config = conftest.tiny_config(**{"train.batch_size": ROWS})
    config.schedule.warmup_steps = 0
    if num_processes > 1:
        config.distributed.initialize = True
        config.distributed.coordinator_address = f"localhost:{port}"
        config.distributed.num_processes = num_processes
        config.distributed.process_id = process_id
        loop.maybe_initialize_distributed(config)
    setup = create_train_setup(config)
    batch = random_batch(ROWS, RowShape(32, 3, 8), vocab_size=512, seed=4)
    rows = ROWS // num_processes
    local = {k: v[process_id * rows : (process_id + 1) * rows] for k, v in batch.items()}
    state, metrics = setup.train_step(
        setup.state, sharding.global_batch(setup.mesh, local), jax.random.key(1)
    )
    leaves = jax.tree_util.tree_leaves(state.params)
    gathered = [
        np.asarray(jax.experimental.multihost_utils.process_allgather(x, tiled=True))
        for x in leaves
    ]
    print(
        json.dumps(
            {
                "devices": jax.device_count(),
                "loss": float(metrics["loss"]),
                "sequences": float(metrics["sequences"]),
                "param_checksum": float(sum(np.abs(g).sum() for g in gathered)),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
