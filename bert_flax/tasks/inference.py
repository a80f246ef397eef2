"""Inference for any task: a model's outputs jitted on a mesh under the training's
logical-axis rules, the parameters placed as in training, each batch split over the batch axes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh

from bert_flax import sharding


def sharded_apply(
    model: nn.Module,
    mesh: Mesh,
    example: dict[str, np.ndarray],
    outputs: Callable[[Any], Any],
) -> tuple[Callable, Any]:
    """(`outputs(model(params, batch))` jitted on `mesh`, replicated; the parameters'
    shardings, from an abstract initialisation on `example`, a batch of the model's inputs)."""
    rules = sharding.rules_for_mesh(mesh)
    with sharding.partitioning(mesh, rules):
        abstract = jax.eval_shape(
            functools.partial(model.init, deterministic=True), jax.random.key(0), example
        )
    shardings = sharding.param_shardings(abstract, mesh, rules)["params"]
    apply = sharding.jit_partitioned(
        lambda p, b: outputs(model.apply({"params": p}, b, deterministic=True)),
        mesh,
        rules,
        in_shardings=(shardings, sharding.batch_sharding(mesh)),
        out_shardings=sharding.replicated(mesh),
    )
    return apply, shardings


def data_parallel_rows(rows: int, mesh: Mesh) -> int:
    """`rows` rounded up to a multiple of the mesh's data-parallel size."""
    data_parallel = sharding.data_parallel_size(mesh)
    return -(-rows // data_parallel) * data_parallel
