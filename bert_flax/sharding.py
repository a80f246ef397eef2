"""Logical-axis rules (t5x style) and helpers that turn them into `NamedSharding`s.

Parameters and activations of the model are annotated with logical axis names; this table maps
them onto the mesh axes "data" (pure data parallelism), "fsdp" (data parallelism with sharded
parameters and optimizer state) and "model" (tensor parallelism):

    mesh = create_mesh((n_data, n_fsdp, n_model))
    with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_AXIS_RULES):
        ...  # jit the step with out_shardings=param_shardings(abstract_variables, mesh)

A mesh axis of size 1 makes its rules a no-op, so one table serves every layout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "model")

Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

LOGICAL_AXIS_RULES: Rules = (
    # Activations: batch over data and fsdp; tensor-parallel dims over model.
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_mlp", "model"),
    ("activation_heads", "model"),
    ("activation_kv", None),
    ("activation_vocab", "model"),
    ("activation_predictions", None),
    # Parameters: the embed dim is sharded over fsdp (ZeRO-3 style), tensor-parallel dims over
    # model (Megatron layout: column-parallel QKV / FFN-in, row-parallel output projections).
    ("embed", "fsdp"),
    ("mlp", "model"),
    ("joined_kv", "model"),
    ("vocab", "model"),
    ("position_table", None),
    ("type_table", None),
    ("classes", None),
    ("norm", None),
)


def create_mesh(shape: Sequence[int], axis_names: Sequence[str] = MESH_AXES, **kwargs) -> Mesh:
    """`jax.make_mesh` with Auto axis types, which flax's logical constraints require.

    (Since JAX 0.7 `jax.make_mesh` defaults to Explicit axes, under which the model's gathers
    would need explicit output shardings.) `kwargs` go to `jax.make_mesh` (e.g. `devices`).
    """
    axis_types = (jax.sharding.AxisType.Auto,) * len(axis_names)
    return jax.make_mesh(tuple(shape), tuple(axis_names), axis_types=axis_types, **kwargs)


def logical_to_mesh_specs(logical_specs: Any, rules: Rules = LOGICAL_AXIS_RULES) -> Any:
    """Tree of logical `PartitionSpec`s -> tree of mesh `PartitionSpec`s."""
    return nn.logical_to_mesh(logical_specs, rules)


def _fit_to_shape(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh, path: str):
    """Drops mesh axes from dims they do not divide (replicating that dim), with a warning."""
    fitted = []
    for dim, (size, axes) in enumerate(zip(shape, tuple(spec) + (None,) * len(shape))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        shards = 1
        for name in names:
            shards *= mesh.shape[name]
        if size % shards:
            logging.warning(
                "Not sharding dim %d (size %d) of %s over %s (%d shards): not divisible; "
                "it is replicated instead.",
                dim,
                size,
                path,
                names,
                shards,
            )
            axes = None
        fitted.append(axes)
    return PartitionSpec(*fitted)


def unbox(variables: Any) -> Any:
    """Strips the logical-axis boxes without `nn.unbox`'s sharding constraints.

    (`nn.unbox` re-applies the rules, which fails for dims that `param_shardings` chose to
    replicate because the mesh does not divide them.)
    """
    return jax.tree.map(
        lambda x: x.unbox(apply_constraint=False) if isinstance(x, nn.Partitioned) else x,
        variables,
        is_leaf=lambda x: isinstance(x, nn.Partitioned),
    )


def param_shardings(abstract_variables: Any, mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> Any:
    """NamedShardings for (abstract) boxed variables from `jax.eval_shape(model.init, ...)`.

    Dims whose size the mesh axes do not divide (e.g. a 30,522-word vocabulary over 4-way
    "model") are replicated, and a warning names them.
    """
    mesh_specs = logical_to_mesh_specs(nn.get_partition_spec(abstract_variables), rules)
    shapes = unbox(abstract_variables)

    def to_sharding(path, spec, leaf):
        return NamedSharding(
            mesh, _fit_to_shape(spec, leaf.shape, mesh, jax.tree_util.keystr(path))
        )

    return jax.tree_util.tree_map_with_path(
        to_sharding, mesh_specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )


def batch_sharding(mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> NamedSharding:
    """Sharding of every batch feature: the leading (batch) dim over the activation_batch axes."""
    spec = nn.logical_to_mesh_axes(("activation_batch",), rules)
    return NamedSharding(mesh, spec)
