"""SOAP's state, update and eigenbasis refresh (the builder and the algorithm: :mod:`optim.soap`).

SOAP takes Shampoo's configuration (``ShampooConfig`` with ``preconditioner="eigenbasis"``),
blocking and statistics (:mod:`optim.shampoo_core`); what it keeps and computes from them is its
own. State (all arrays): ``count``, ``bases_step`` (the update whose statistics the eigenbases in
use were computed from), ``basis_failures`` (eigendecompositions that came out non-finite and kept
the previous basis) and per parameter a :class:`SoapTensorState`.

Checkpoints written before SOAP had this state (commit 8ea607a and older) hold it in Shampoo's
layout (``ShampooState`` / ``TensorState``: the eigenbases as ``factor_roots``, Adam's moments as
``momentum`` and ``graft``); :func:`legacy_layout` and :func:`from_legacy_layout` translate, and
``bert_flax.train`` restores such checkpoints through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from optim import matrix_roots
from optim.shampoo_blocks import BlockPlan, apply_factor
from optim.shampoo_core import (
    Layerwise,
    ShampooConfig,
    ShampooState,
    TensorState,
    accumulate,
    initial_factors,
    solve_factors,
    updated_factor_stats,
)


class SoapTensorState(NamedTuple):
    """SOAP's state for one parameter."""

    factor_stats: tuple[jax.Array, ...]  # Shampoo's: one [num_blocks, b, b] per full dimension
    eigenbases: tuple[jax.Array, ...]  # their eigenvectors in use (columns); identity at first
    # Adam's moments of the gradient rotated into the eigenbases: blocked [num_blocks, b_1, ...]
    # (param-shaped for vectors); no first moment, (), when b1 == 0.
    first_moment: Any
    second_moment: jax.Array


class SoapState(NamedTuple):
    count: jax.Array  # int32: updates applied
    bases_step: jax.Array  # int32: the bases in use come from the statistics after this update
    basis_failures: jax.Array  # int32: non-finite bases (the previous one kept), in total
    tensors: Any  # pytree like the params, of SoapTensorState


def _is_soap_tensor(x: Any) -> bool:
    return isinstance(x, SoapTensorState)


def _init_tensor(param: jax.Array, plan: BlockPlan, config: ShampooConfig) -> SoapTensorState:
    stats, bases = initial_factors(plan)
    moment_shape = param.shape if plan.elementwise else (plan.num_blocks, *plan.block_dims)
    first = jnp.zeros(moment_shape, jnp.float32) if config.b1 else ()
    return SoapTensorState(stats, bases, first, jnp.zeros(moment_shape, jnp.float32))


def _rotate(blocks: jax.Array, bases: Sequence[jax.Array], dims: Sequence[int], into: bool):
    """``blocks`` rotated into the bases (``Q^T`` on each of ``dims``), or back out (``Q``)."""
    for basis, dim in zip(bases, dims):
        blocks = apply_factor(blocks, jnp.swapaxes(basis, -1, -2) if into else basis, dim)
    return blocks


def _direction(g, tensor: SoapTensorState, plan: BlockPlan, count, config: ShampooConfig):
    """SOAP (Vyas et al., 2024): Adam on the gradient rotated into the eigenbases of its
    statistics, rotated back; its new statistics and moments. Vectors and diagonal dimensions
    keep the identity basis (plain Adam there)."""
    blocks = g if plan.elementwise else plan.block(g)
    dims = plan.full_dims
    stats = updated_factor_stats(blocks, tensor, plan, count, config)
    rotated = _rotate(blocks, tensor.eigenbases, dims, into=True)
    t = (count + 1).astype(jnp.float32)
    second = accumulate(tensor.second_moment, jnp.square(rotated), config.graft_b2)
    first = accumulate(tensor.first_moment, rotated, config.b1) if config.b1 else ()
    numerator = first / (1.0 - config.b1**t) if config.b1 else rotated
    adam = numerator / (jnp.sqrt(second / (1.0 - config.graft_b2**t)) + config.graft_epsilon)
    direction = _rotate(adam, tensor.eigenbases, dims, into=False)
    new_tensor = SoapTensorState(stats, tensor.eigenbases, first, second)
    return (direction if plan.elementwise else plan.unblock(direction)), new_tensor


def adopt_bases(tensors: Any, bases: Sequence[jax.Array], config: ShampooConfig) -> Any:
    """``tensors`` with new eigenbases (in :func:`basis_lists` order) and Adam's moments carried
    into them: per dimension ``R = Q_new^T Q_old``, the first moment ``M <- R M`` exactly, the
    second ``V <- (R * R) V``, exact when the new basis only reorders or flips the old one (the
    SOAP paper's reordering) and Adam's usual estimate otherwise."""
    flat, treedef = jax.tree.flatten(tensors, is_leaf=_is_soap_tensor)
    bases = iter(bases)
    out = []
    for tensor in flat:
        new = tuple(next(bases) for _ in tensor.eigenbases)
        if new:
            # Full dimensions are those whose block size fits a preconditioner: a diagonal one
            # is longer than max_preconditioner_dim, a full one's block is not.
            sizes = tensor.second_moment.shape[1:]
            dims = [i for i, b in enumerate(sizes) if b <= config.max_preconditioner_dim]
            rotations = [
                jnp.einsum("Nab,Nac->Nbc", n, o, precision=lax.Precision.HIGHEST)
                for n, o in zip(new, tensor.eigenbases)
            ]
            second = _rotate(
                tensor.second_moment, [jnp.square(r) for r in rotations], dims, into=False
            )
            first = tensor.first_moment
            if config.b1:
                first = _rotate(first, rotations, dims, into=False)
            tensor = SoapTensorState(tensor.factor_stats, new, first, second)
        out.append(tensor)
    return jax.tree.unflatten(treedef, out)


def basis_lists(tensors: Any) -> tuple[list[jax.Array], list[jax.Array]]:
    """All full factors of a state, flat: ``(stats, eigenbases)`` in a fixed order."""
    stats, bases = [], []
    for tensor in jax.tree.leaves(tensors, is_leaf=_is_soap_tensor):
        stats.extend(tensor.factor_stats)
        bases.extend(tensor.eigenbases)
    return stats, bases


def _eigenbasis(a: jax.Array, p: int) -> matrix_roots.SolveResult:
    del p  # (an eigenbasis has no exponent)
    return matrix_roots.eigenbasis(a)


def compute_eigenbases(stats, old_bases) -> tuple[list[jax.Array], jax.Array]:
    """The eigenbases of flat lists of statistics, keeping the old basis where one comes out
    non-finite or has nothing to compute; ``(bases, failures)``. The same function runs in the
    graph and on the host."""
    bases, failures, _ = solve_factors(stats, old_bases, [0] * len(stats), _eigenbasis)
    return bases, failures


def _refresh_in_graph(state: SoapState, tensors: Any, config: ShampooConfig):
    """The synchronous mode's refresh: new bases when the statistics after this update are due."""
    stats, bases = basis_lists(tensors)
    if not stats:
        return tensors, state.bases_step, state.basis_failures
    count = state.count + 1

    def refresh():
        new_bases, failures = compute_eigenbases(stats, bases)
        return adopt_bases(tensors, new_bases, config), count, state.basis_failures + failures

    def keep():
        return tensors, state.bases_step, state.basis_failures

    return lax.cond(config.refresh_due(count), refresh, keep)


def scale_by_soap(
    config: ShampooConfig, layerwise: Layerwise | None = None
) -> optax.GradientTransformation:
    """SOAP's direction and bookkeeping, no lr/decay; the leaves `layerwise` selects are stacked
    layers, each with its own bases."""

    def init_fn(params):
        treedef = jax.tree.structure(params)
        leaves = zip(jax.tree.leaves(params), config.plans(params, layerwise))
        tensors = treedef.unflatten([_init_tensor(p, plan, config) for p, plan in leaves])
        zero = jnp.zeros((), jnp.int32)
        return SoapState(zero, zero, zero, tensors)

    def update_fn(updates, state, params=None):
        del params
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), updates)
        treedef = jax.tree.structure(grads)
        results = [
            _direction(g, t, plan, state.count, config)
            for g, t, plan in zip(
                treedef.flatten_up_to(grads),
                treedef.flatten_up_to(state.tensors),
                config.plans(grads, layerwise),
            )
        ]
        directions = [d.astype(u.dtype) for (d, _), u in zip(results, jax.tree.leaves(updates))]
        tensors = treedef.unflatten([tensor for _, tensor in results])
        bases_step, failures = state.bases_step, state.basis_failures
        if not config.asynchronous:
            tensors, bases_step, failures = _refresh_in_graph(state, tensors, config)
        new_state = SoapState(state.count + 1, bases_step, failures, tensors)
        return treedef.unflatten(directions), new_state

    return optax.GradientTransformation(init_fn, update_fn)


def _is_soap_state(x: Any) -> bool:
    return isinstance(x, SoapState)


def _scalar_like(x: Any, dtype) -> Any:
    """A zero scalar of ``dtype`` placed as ``x`` (an array or a shape struct) is."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((), dtype, sharding=x.sharding)
    return jnp.zeros((), dtype)


def _to_legacy(state: SoapState) -> ShampooState:
    def tensor(t: SoapTensorState) -> TensorState:
        return TensorState(t.factor_stats, t.eigenbases, (), t.second_moment, t.first_moment)

    tensors = jax.tree.map(tensor, state.tensors, is_leaf=_is_soap_tensor)
    error = _scalar_like(state.count, jnp.float32)  # (always 0: eigh has no error estimate)
    return ShampooState(state.count, state.bases_step, state.basis_failures, error, tensors)


def legacy_layout(tree: Any) -> Any | None:
    """``tree`` (arrays or shape structs) with every :class:`SoapState` in the layout checkpoints
    of commit 8ea607a and older have; None when it holds none."""
    if not any(_is_soap_state(x) for x in jax.tree.leaves(tree, is_leaf=_is_soap_state)):
        return None
    return jax.tree.map(
        lambda x: _to_legacy(x) if _is_soap_state(x) else x, tree, is_leaf=_is_soap_state
    )


def from_legacy_layout(legacy: Any, like: Any) -> Any:
    """The tree ``like`` is, its values from ``legacy`` (read in :func:`legacy_layout`'s layout)."""
    flat, treedef = jax.tree.flatten(like, is_leaf=_is_soap_state)
    values = treedef.flatten_up_to(legacy)

    def tensor(t: TensorState) -> SoapTensorState:
        return SoapTensorState(t.factor_stats, t.factor_roots, t.momentum, t.graft)

    def state(old: ShampooState) -> SoapState:
        tensors = jax.tree.map(tensor, old.tensors, is_leaf=lambda x: isinstance(x, TensorState))
        return SoapState(old.count, old.roots_step, old.root_failures, tensors)

    return treedef.unflatten([state(v) if _is_soap_state(x) else v for x, v in zip(flat, values)])
