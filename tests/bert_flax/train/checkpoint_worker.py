"""Run by test_train_checkpointing.py: process `process_id` of 2 (jax.distributed on localhost,
one CPU device each) restores the latest checkpoint of two workdirs, the arrays split over both
processes' devices, saves what it restored from the first as step 8, and prints what each gave as
JSON.
In process 1 only, the listing of the first lags (its newest step unseen) and reads of the second
fail with an I/O error (EIO)."""

from __future__ import annotations

import errno
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec
from test_train_checkpointing import kernel, small_state

from bert_flax import errors
from bert_flax.train import resume


def restored(workdir: str, lagging: bool = False) -> dict:
    """{"step", "kernel_ok": whether this process's rows are that step's} or {"error"}; the
    restored state saved again as step 8. `lagging`: the newest step is missing from the
    listing."""
    state = small_state(0)
    mesh = jax.make_mesh((2,), ("data",))
    shardings = jax.tree.map(
        lambda x: NamedSharding(mesh, PartitionSpec("data") if np.ndim(x) else PartitionSpec()),
        state,
    )
    checkpointer = resume.Checkpointer(workdir, every_steps=1, keep=10)
    manager = checkpointer.manager
    if lagging:
        manager.all_steps = lambda: sorted(type(manager).all_steps(manager))[:-1]
    try:
        state, progress = checkpointer.restore_latest(state, shardings)
        vars(manager).pop("all_steps", None)
        checkpointer.save(8, state, progress)
    except errors.CheckpointError as error:
        return {"error": str(error)}
    finally:
        checkpointer.close()
    step = int(state.step.addressable_data(0))
    (shard,) = state.params["dense"]["kernel"].addressable_shards
    return {"step": step, "kernel_ok": bool(np.array_equal(shard.data, kernel(step)[shard.index]))}


def fail(*args, **kwargs):
    raise OSError(errno.EIO, "Input/output error")


def main():
    process_id, port, damaged, transient = sys.argv[1:]
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=int(process_id))
    result = {"damaged": restored(damaged, lagging=process_id == "1")}
    if process_id == "1":
        ocp.StandardCheckpointHandler.restore = fail
    result["transient"] = restored(transient)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
