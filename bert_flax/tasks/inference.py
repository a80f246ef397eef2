"""Inference for any task: a model's outputs jitted on a mesh under the training's
logical-axis rules, the parameters placed as in training, each batch split over the batch axes;
`predict_rows` runs it over a table of examples in packed (or padded) rows."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh

from bert_flax import sharding
from bert_flax.input_pipeline import rows as data_rows


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


def predict_rows(
    model: nn.Module,
    params: Any,
    examples: data_rows.Examples,
    *,
    inputs: Sequence[str],
    outputs: Callable[[Any], Any],
    max_seq_length: int,
    max_sequences_per_pack: int,
    packed: bool,
    algorithm: str,
    rows: int,
    mesh: Mesh | None = None,
) -> Iterator[tuple[dict[str, np.ndarray], Any]]:
    """(batch, `outputs(model(batch))` on the host) for every batch of `examples` in order:
    packed rows (one example a row unless `packed`), `rows` a batch (rounded up to a multiple of
    the data-parallel size), the last padded with empty rows, on `mesh` (default: every device,
    data parallel)."""
    mesh = mesh or sharding.create_mesh((-1, 1, 1))
    batches = data_rows.batches(
        examples,
        batch_size=data_parallel_rows(rows, mesh),
        max_seq_length=max_seq_length,
        max_sequences_per_pack=max_sequences_per_pack if packed else 1,
        packed=packed,
        algorithm=algorithm,
        shuffle=False,
        pad_final=True,
    )
    first = next(batches)
    model_inputs = lambda batch: {name: batch[name] for name in inputs}
    apply, shardings = sharded_apply(model, mesh, model_inputs(first), outputs)
    params = jax.device_put(params, shardings)
    for batch in itertools.chain([first], batches):
        placed = jax.device_put(model_inputs(batch), sharding.batch_sharding(mesh))
        yield batch, jax.device_get(apply(params, placed))
