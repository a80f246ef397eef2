"""A run's train and eval steps compiled ahead of time for an accelerator this host lacks.

`compile_steps(config, devices)` builds exactly what `create_train_setup` builds (the config's
rules, optimizer, attention back-end, packed row shapes, micro-batching) over compile-only devices
of a `targets.Target`, from abstract shapes only (`jax.ShapeDtypeStruct`s carrying shardings: no
parameter, no batch, no device memory), and compiles both steps; `report.report` reads them
against the chip, `largest_batch` bisects over compiles for the most rows per step that fit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from bert_flax import sharding
from bert_flax.train import setup as train_setup


def abstract_batch(task: Any, rows: int, mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """Shapes and dtypes of a global batch of `rows`, sharded as the loop shards batches."""
    example = task.synthetic_batch(1, seed=0)
    batch_sharding = sharding.batch_sharding(mesh)
    return {
        name: jax.ShapeDtypeStruct(
            (rows, *np.shape(v)[1:]), np.asarray(v).dtype, sharding=batch_sharding
        )
        for name, v in example.items()
    }


@contextlib.contextmanager
def _no_persistent_cache():
    """Compile-only executables cannot be read back from jax's persistent compilation cache
    (each try warns), so programs compiled here are kept out of it."""
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # the cache decides once whether it is on; ask it again
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


@dataclasses.dataclass
class Compiled:
    """The compiled steps of a config on a target and the program they came from."""

    program: train_setup.TrainProgram
    train: Any
    eval: Any  # None when not asked for
    seconds: dict[str, float]
    attention_visited_fraction: float = 1.0  # `Report.attention_visited_fraction`
    attention_needed_fraction: float = 1.0  # `Report.attention_needed_fraction`


def compile_steps(
    config: ml_collections.ConfigDict,
    devices: list[jax.Device],
    packing_factor: float | None = None,
    *,
    evaluate: bool = True,
    attention_visited_fraction: float = 1.0,
    attention_needed_fraction: float = 1.0,
) -> Compiled:
    """Compiles the train step of `config` (and its eval step, if `evaluate`) for `devices`
    (compile-only ones are enough); the roofline will charge the block-skipping attention
    `attention_visited_fraction` of dense attention, and count the model's attention FLOPs at
    `attention_needed_fraction` of dense attention's (`packings`: the functions of those names)."""
    mesh = sharding.mesh_of(config.mesh, devices)
    started = time.perf_counter()
    program = train_setup.create_train_program(config, mesh, packing_factor_override=packing_factor)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding.replicated(mesh))
    batch = abstract_batch(program.task, program.adjustment.batch_size, mesh)
    eval_batch = abstract_batch(program.task, config.eval.batch_size, mesh)
    with _no_persistent_cache():
        traced = time.perf_counter()
        train = program.train_step.lower(program.abstract_state, batch, key).compile()
        compiled = time.perf_counter()
        params = program.abstract_state.params
        eval_step = program.eval_step.lower(params, eval_batch).compile() if evaluate else None
    seconds = {
        "trace": traced - started,
        "train": compiled - traced,
        "eval": time.perf_counter() - compiled,
    }
    fractions = (attention_visited_fraction, attention_needed_fraction)
    return Compiled(program, train, eval_step, seconds, *fractions)
