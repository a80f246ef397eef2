"""The device mesh from the config, and how batches are laid out on it."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

# Mesh axes a batch is split over (data parallelism, including fully-sharded data parallelism).
BATCH_AXES = ("data", "fsdp")
KNOWN_AXES = ("data", "fsdp", "model")


def resolve_mesh_shape(
    shape: Sequence[int], axes: Sequence[str], num_devices: int
) -> tuple[int, ...]:
    """Replaces one -1 in `shape` by the devices left over; checks the product fits the devices."""
    shape, axes = tuple(int(s) for s in shape), tuple(axes)
    if len(shape) != len(axes):
        raise ValueError(f"config.mesh.shape {shape} and config.mesh.axes {axes} differ in length.")
    unknown = sorted(set(axes) - set(KNOWN_AXES))
    if unknown or len(set(axes)) != len(axes):
        raise ValueError(
            f"config.mesh.axes {axes} must be distinct names among {KNOWN_AXES}; got {unknown}."
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


def create_mesh(mesh_config, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """`jax.make_mesh` over `config.mesh` (axes among data/fsdp/model; one size may be -1)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(mesh_config.shape, mesh_config.axes, len(devices))
    axes = tuple(mesh_config.axes)
    return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes), devices=devices)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes the leading (batch) dimension is split over."""
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def data_parallel_size(mesh: Mesh) -> int:
    """Number of batch shards: the product of the data-parallel mesh axes."""
    return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading dimension split over the data-parallel axes, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(batch_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def check_batch_fits(mesh: Mesh, global_rows: int, accumulation: int, what: str = "batch") -> int:
    """Checks that every micro-batch splits evenly over data shards and hosts; returns its rows."""
    if global_rows <= 0 or accumulation <= 0:
        raise ValueError(f"{what}: batch_size {global_rows} and accumulation {accumulation} > 0.")
    if global_rows % accumulation:
        raise ValueError(
            f"{what}: batch_size {global_rows} is not divisible by accumulation {accumulation}."
        )
    micro = global_rows // accumulation
    shards = data_parallel_size(mesh)
    if micro % shards:
        raise ValueError(
            f"{what}: the micro-batch of {micro} rows (batch_size {global_rows} / accumulation "
            f"{accumulation}) is not divisible by the {shards} data-parallel shards of mesh "
            f"{dict(mesh.shape)}; make batch_size a multiple of {shards * accumulation}."
        )
    if global_rows % jax.process_count():
        raise ValueError(
            f"{what}: batch_size {global_rows} is not divisible by {jax.process_count()} processes."
        )
    return micro


def global_batch(mesh: Mesh, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Assembles each process's rows into one global array per feature, split over the batch axes.

    Every process passes its own `batch_size / process_count` rows (in process order).
    """
    sharding = batch_sharding(mesh)
    return {
        name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
        for name, value in local_batch.items()
    }


@contextlib.contextmanager
def partitioning(mesh: Mesh, rules: Sequence[tuple[str, Any]]):
    """Inside a traced function: flax logical-axis rules plus the mesh that activation
    constraints (`nn.with_logical_constraint`) resolve against."""
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
        yield


def rules_for_mesh(rules: Sequence[tuple[str, Any]], mesh: Mesh) -> list[tuple[str, Any]]:
    """Drops mesh axes the mesh does not have from logical-axis rules (e.g. a data-only mesh)."""
    out = []
    for logical, axes in rules:
        if axes is None or isinstance(axes, str):
            out.append((logical, axes if axes in mesh.axis_names else None))
        else:
            kept = tuple(a for a in axes if a in mesh.axis_names)
            out.append((logical, kept or None))
    return out
