"""The TrainState, created directly sharded over the mesh from flax logical-axis annotations.

Parameters are annotated with logical axis names (`nn.with_logical_partitioning`); the rules
(`bert_flax.sharding.LOGICAL_AXIS_RULES`) map them to mesh axes. `create_sharded_state` traces
the initialisation with `jax.eval_shape` (no memory), derives a `NamedSharding` for every leaf
(`bert_flax.sharding.param_shardings`; dimensions a mesh axis does not divide are replicated),
then runs the initialisation under `jax.jit(..., out_shardings=...)`, so no device ever holds a
full unsharded copy. Optimizer-state leaves that mirror a parameter (Adam/LAMB moments, ...)
inherit its sharding; everything else (step counters, Shampoo statistics, ...) is replicated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_flax import sharding
from bert_flax.mesh import partitioning

LogicalRules = Sequence[tuple[str, str | tuple[str, ...] | None]]


@flax.struct.dataclass
class TrainState:
    """Everything a step updates; the optimizer itself (an optax transformation) is static."""

    step: jax.Array
    params: Any
    opt_state: optax.OptState

    @classmethod
    def create(cls, params: Any, tx: optax.GradientTransformation) -> TrainState:
        return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def mirror_shardings(tree: Any, params: Any, shardings: Any, mesh: Mesh) -> Any:
    """Shardings for `tree` (e.g. an optimizer state): subtrees shaped like `params` take
    the parameters' shardings leaf by leaf (where shapes match); other leaves are replicated."""
    params_def = jax.tree_util.tree_structure(params)
    param_leaves = params_def.flatten_up_to(params)
    sharding_leaves = params_def.flatten_up_to(shardings)
    replicated = NamedSharding(mesh, PartitionSpec())

    def mirrors_params(node: Any) -> bool:
        try:
            return jax.tree_util.tree_structure(node) == params_def
        except TypeError:
            return False

    def assign(node: Any) -> Any:
        if mirrors_params(node):
            leaves = params_def.flatten_up_to(node)
            return params_def.unflatten(
                [
                    s if getattr(x, "shape", None) == p.shape else replicated
                    for x, p, s in zip(leaves, param_leaves, sharding_leaves)
                ]
            )
        return replicated

    return jax.tree_util.tree_map(assign, tree, is_leaf=mirrors_params)


def create_sharded_state(
    init_params: Callable[[jax.Array], Any],
    tx: optax.GradientTransformation,
    mesh: Mesh,
    rules: LogicalRules,
    rng: jax.Array,
) -> tuple[TrainState, TrainState]:
    """Initialises a TrainState directly sharded; returns it and its tree of shardings.

    `init_params(rng)` returns the (logically boxed) parameter tree, e.g.
    `lambda rng: model.init(rng, batch, deterministic=True)["params"]`.
    """

    def init_state(rng: jax.Array) -> TrainState:
        with partitioning(mesh, rules):
            params = nn.unbox(init_params(rng))
        return TrainState.create(params, tx)

    with partitioning(mesh, rules):
        boxed = jax.eval_shape(init_params, rng)
    params_sharding = sharding.param_shardings(boxed, mesh, rules)
    abstract = jax.eval_shape(init_state, rng)
    shardings = TrainState(
        step=NamedSharding(mesh, PartitionSpec()),
        params=params_sharding,
        opt_state=mirror_shardings(abstract.opt_state, abstract.params, params_sharding, mesh),
    )
    state = jax.jit(init_state, out_shardings=shardings)(rng)
    return state, shardings


def abstract_state(state_shardings: TrainState, state: TrainState) -> TrainState:
    """ShapeDtypeStructs with shardings (what orbax restores into)."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, state_shardings
    )


def count_params(params: Mapping[str, Any]) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
