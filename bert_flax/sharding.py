"""Partitioning, in the t5x manner: one logical-axis rule table and everything derived from it.

Parameters and activations of the model carry logical axis names; `LOGICAL_AXIS_RULES` maps them
onto the mesh axes "data" (pure data parallelism), "fsdp" (data parallelism with sharded
parameters and optimizer state) and "model" (tensor parallelism). The batch axes, every
`NamedSharding` (parameters, optimizer state, batches) and the context a traced step runs in
all come from this table, so one edit here changes the layout everywhere:

    mesh = create_mesh((-1, 1, 1))              # (data, fsdp, model); -1 = remaining devices
    rules = rules_for_mesh(mesh)
    shardings = param_shardings(jax.eval_shape(init, key), mesh, rules)
    step = jit_partitioned(step_fn, mesh, rules, in_shardings=..., out_shardings=...)

A mesh axis of size 1 makes its rules a no-op, so one table serves every layout.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "model")

Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# The logical name of every batch feature's leading dimension.
BATCH = "activation_batch"

LOGICAL_AXIS_RULES: Rules = (
    # Activations: batch over data and fsdp; tensor-parallel dims over model.
    (BATCH, ("data", "fsdp")),
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
    ("relative_buckets", None),  # the relative-position bias table [buckets, heads]: small
    ("relative_heads", None),
    ("layers", None),  # the stacked layers of `BertConfig.scan_layers`: every device holds all
)


def rules_config() -> dict[str, tuple[str, ...]]:
    """The table as `config.mesh.rules` holds it: logical name -> mesh axes, a tuple each
    (() = replicated), so that a run can move one from the command line:
    `--config.mesh.rules.vocab="('fsdp',)"`, `--config.mesh.rules.embed="()"`."""
    return {logical: _as_axes(axes) for logical, axes in LOGICAL_AXIS_RULES}


def _as_axes(axes: str | Sequence[str] | None) -> tuple[str, ...]:
    """A rule's mesh axes as a tuple (flax writes None, one name, or several)."""
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def rules_from_config(table: Any) -> Rules:
    """`config.mesh.rules` (a mapping like `rules_config()`'s) as flax rules, checked: every
    logical name must be the table's, every mesh axis one of `MESH_AXES`, and the batch's rule
    the table's (batches are placed by it outside any step)."""
    known = rules_config()
    rules = []
    for logical, axes in dict(table).items():
        if logical not in known:
            raise ValueError(
                f"config.mesh.rules.{logical}: not a logical axis of the model; the table's "
                f"names are {sorted(known)}."
            )
        axes = _as_axes(axes)
        unknown = sorted(set(axes) - set(MESH_AXES))
        if unknown:
            raise ValueError(
                f"config.mesh.rules.{logical}={axes}: {unknown} are not mesh axes; use a tuple "
                f"of {MESH_AXES}, or () to replicate."
            )
        if logical == BATCH and axes != known[BATCH]:
            raise ValueError(
                f"config.mesh.rules.{BATCH}={axes}: the batch is split over {known[BATCH]} "
                "wherever batches are placed (`batch_sharding`); choose the split with "
                "config.mesh.shape instead (a size-1 axis splits nothing)."
            )
        rules.append((logical, axes[0] if len(axes) == 1 else axes or None))
    return tuple(rules)


# -- The mesh ------------------------------------------------------------------------------------


def resolve_mesh_shape(
    shape: Sequence[int], axes: Sequence[str], num_devices: int
) -> tuple[int, ...]:
    """Replaces one -1 in `shape` by the devices left over; checks the product fits the devices."""
    shape, axes = tuple(int(s) for s in shape), tuple(axes)
    if len(shape) != len(axes):
        raise ValueError(f"config.mesh.shape {shape} and config.mesh.axes {axes} differ in length.")
    unknown = sorted(set(axes) - set(MESH_AXES))
    if unknown or len(set(axes)) != len(axes):
        raise ValueError(
            f"config.mesh.axes {axes} must be distinct names among {MESH_AXES}; got {unknown}."
        )
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"config.mesh.shape {shape}: positive sizes and at most one -1.")
    fixed = math.prod(s for s in shape if s != -1)
    if fixed > num_devices or num_devices % fixed:
        raise ValueError(
            f"config.mesh.shape {shape} needs {fixed} devices (or a multiple, with -1), but there "
            f"are {num_devices} ({jax.default_backend()}). Shrink the mesh, or on CPU simulate "
            "devices with XLA_FLAGS=--xla_force_host_platform_device_count=N."
        )
    if -1 in shape:
        shape = tuple(num_devices // fixed if s == -1 else s for s in shape)
    return shape


def create_mesh(
    shape: Sequence[int],
    axes: Sequence[str] = MESH_AXES,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """`jax.make_mesh` over `devices` (default: all) with one size possibly -1.

    Axis types are Auto, which flax's logical constraints need (since JAX 0.7 `jax.make_mesh`
    defaults to Explicit axes, under which the model's gathers would need explicit shardings).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(shape, axes, len(devices))
    axes = tuple(axes)
    return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes), devices=devices)


def mesh_of(mesh_config: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh a config's `mesh` section describes (`shape`, `axes`) over `devices`."""
    return create_mesh(mesh_config.shape, mesh_config.axes, devices)


def layout(mesh_config: Any, mesh: Mesh | None = None) -> tuple[Mesh, list[tuple[str, Any]]]:
    """A run's mesh (`mesh`, else the one `mesh_config` describes) and the logical-axis rules of
    `mesh_config.rules` that it supports."""
    mesh = mesh_of(mesh_config) if mesh is None else mesh
    return mesh, rules_for_mesh(mesh, rules_from_config(mesh_config.rules))


def rules_for_mesh(mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> list[tuple[str, Any]]:
    """The rules with mesh axes that `mesh` does not have dropped (e.g. a data-only mesh)."""
    out = []
    for logical, axes in rules:
        if axes is None or isinstance(axes, str):
            out.append((logical, axes if axes in mesh.axis_names else None))
        else:
            kept = tuple(a for a in axes if a in mesh.axis_names)
            out.append((logical, kept or None))
    return out


@contextlib.contextmanager
def partitioning(mesh: Mesh, rules: Rules):
    """Inside a traced function: flax logical-axis rules plus the mesh that activation
    constraints (`nn.with_logical_constraint`) resolve against."""
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
        yield


def target_platform() -> str:
    """The platform ("cpu", "gpu", "tpu") of the devices the program being traced is for: the
    mesh's inside `partitioning` (compile-only TPU devices on a CPU host: "tpu"), else the
    default backend's. Kernels pick their lowering by it, not by the host they trace on."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    return _platform_name(jax.default_backend() if device is None else device.platform)


def mesh_platform(mesh: Mesh) -> str:
    """The platform ("cpu", "gpu", "tpu") of `mesh`'s devices: `target_platform()` of the
    programs traced for it."""
    return _platform_name(mesh.devices.flat[0].platform)


def _platform_name(platform: str) -> str:
    return "gpu" if platform in ("cuda", "rocm") else platform


# XLA options every program for a platform is compiled with. GPU: LayerNorm as cuDNN's fused
# kernel (forward and backward), which XLA's GPU fusion otherwise splits into several passes over
# the activations (docs/compile.md, "The GPU step").
COMPILER_OPTIONS: dict[str, dict[str, Any]] = {"gpu": {"xla_gpu_enable_cudnn_layer_norm": True}}


def jit_partitioned(fn: Callable, mesh: Mesh, rules: Rules, **jit_kwargs: Any) -> Callable:
    """`jax.jit(fn, **jit_kwargs)` with `fn` traced inside `partitioning(mesh, rules)`, compiled
    with the `COMPILER_OPTIONS` of `mesh`'s platform."""

    @functools.wraps(fn)
    def partitioned(*args: Any) -> Any:
        with partitioning(mesh, rules):
            return fn(*args)

    options = COMPILER_OPTIONS.get(mesh_platform(mesh))
    return jax.jit(partitioned, compiler_options=options, **jit_kwargs)


# -- Batches -------------------------------------------------------------------------------------


def batch_axes(mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> tuple[str, ...]:
    """The mesh axes a batch's leading dimension is split over: the rule for `BATCH`."""
    axes = dict(rules_for_mesh(mesh, rules))[BATCH]
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def data_parallel_size(mesh: Mesh) -> int:
    """Number of batch shards: the product of the batch axes' sizes."""
    return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Every batch feature: the leading dimension over the batch axes, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(batch_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def global_batch(mesh: Mesh, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Assembles each process's rows into one global array per feature, split over the batch axes.

    Every process passes its own `batch_size / process_count` rows (in process order).
    """
    sharding = batch_sharding(mesh)
    return {
        name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
        for name, value in local_batch.items()
    }


# -- Parameters and state ------------------------------------------------------------------------


def _fit_to_shape(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh, path: str):
    """Drops mesh axes from dims they do not divide (replicating that dim), with a warning."""
    fitted = []
    for dim, (size, axes) in enumerate(zip(shape, tuple(spec) + (None,) * len(shape))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        shards = math.prod(mesh.shape[name] for name in names)
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

    `nn.unbox` re-applies the rules, asking for a split of the dimensions that `param_shardings`
    replicates because the mesh does not divide them: on concrete arrays that raises
    `IndivisibleError` (the 30,522-word vocabulary over a 4-way "model" axis), under jit it
    requests an uneven split. This keeps each leaf's sharding as it is.
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
    mesh_specs = nn.logical_to_mesh(nn.get_partition_spec(abstract_variables), rules)
    shapes = unbox(abstract_variables)

    def to_sharding(path, spec, leaf):
        return NamedSharding(
            mesh, _fit_to_shape(spec, leaf.shape, mesh, jax.tree_util.keystr(path))
        )

    return jax.tree_util.tree_map_with_path(
        to_sharding, mesh_specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )


def mirror_shardings(tree: Any, params: Any, shardings: Any, mesh: Mesh) -> Any:
    """Shardings for `tree` (e.g. an optimizer state): inside every subtree that has the
    parameters' structure as a prefix (Adam's moments: a parameter-shaped array per parameter;
    Shampoo: a per-parameter state holding its momentum and graft), the leaves shaped like their
    parameter take its sharding; every other leaf (counters, Shampoo's block statistics) is
    replicated."""
    params_def = jax.tree_util.tree_structure(params)
    param_leaves = params_def.flatten_up_to(params)
    sharding_leaves = params_def.flatten_up_to(shardings)

    def mirrors_params(node: Any) -> bool:
        try:
            params_def.flatten_up_to(node)
        except (TypeError, ValueError):
            return False
        return True

    def assign(node: Any) -> Any:
        if not mirrors_params(node):
            return replicated(mesh)
        per_param = [
            jax.tree_util.tree_map(
                lambda x, p=p, s=s: s if getattr(x, "shape", None) == p.shape else replicated(mesh),
                sub,
            )
            for sub, p, s in zip(params_def.flatten_up_to(node), param_leaves, sharding_leaves)
        ]
        return params_def.unflatten(per_param)

    return jax.tree_util.tree_map(assign, tree, is_leaf=mirrors_params)


def state_shardings(abstract_state: Any, boxed_params: Any, mesh: Mesh, rules: Rules) -> Any:
    """Shardings of a train state (a struct with `step`, `nonfinite_streak`, `params`,
    `opt_state`).

    Parameters follow the rules; optimizer-state leaves that mirror a parameter (Adam/LAMB
    moments, Shampoo's momentum and graft) inherit its sharding; everything else (step
    counters, Shampoo's block statistics and roots) is replicated.
    """
    params = param_shardings(boxed_params, mesh, rules)
    return abstract_state.replace(
        step=replicated(mesh),
        nonfinite_streak=replicated(mesh),
        params=params,
        opt_state=mirror_shardings(abstract_state.opt_state, abstract_state.params, params, mesh),
    )


def abstract_arrays(tree: Any, shardings: Any) -> Any:
    """`ShapeDtypeStruct`s of `tree` with `shardings` (what orbax restores into)."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )
