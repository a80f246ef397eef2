"""Shampoo's state, configuration, update and root refresh (the builder is ``optim.shampoo``;
SOAP, which shares the configuration and the statistics, is :mod:`optim.soap_core`).

Per parameter (see :mod:`optim.shampoo_blocks` for the blocking), the gradient ``G`` of each
block updates one statistic per dimension, ``L_i <- b2 L_i + (1 - b2) G_(i) G_(i)^T``
(``b2 = 1`` sums; on every ``statistics_compute_steps``-th update only when that is above
1), and the Shampoo direction is ``G x_1 L_1^(-1/p) ... x_k L_k^(-1/p)`` with
``p = 2k`` (``exponent_override`` to change it). The inverse roots are recomputed every
``preconditioning_compute_steps`` (N) steps, starting at ``start_preconditioning_step`` (S):
the roots computed from the statistics after update number ``c`` (c = S, S + N, S + 2N, ...) are
used from update ``c + 1`` on, in both modes:

* synchronous (default): in the graph, under ``lax.cond``, inside the jitted update;
* asynchronous: never in the graph. ``optim.after_step`` hands the statistics to a host thread
  and swaps the finished roots into the state (see :mod:`optim.shampoo_host`). With
  ``max_staleness=0`` it waits for each job at once and the trajectory equals the synchronous one.

Grafting takes each block's step size from a first-order method (``graft``: sgd, adagrad,
rmsprop, adam, or none) and the direction from Shampoo; before S the grafted update is used
alone. Then momentum (an exponential moving average, heavy ball or Nesterov), decoupled weight
decay and the learning rate.

State (all arrays; checkpoint it like any optax state): ``count``, ``roots_step`` (the update
whose statistics the roots in use were computed from), ``root_failures`` (roots that failed
and kept the previous one), ``root_error`` (largest error estimate of the last refresh) and per
parameter a :class:`TensorState` with the block-stacked statistics and roots.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from optim import matrix_roots
from optim.masks import path_names
from optim.shampoo_blocks import (
    BlockPlan,
    apply_diagonal,
    apply_factor,
    diagonal_statistic,
    factor_statistic,
)

# Selects, by a parameter's path names, the leaves stacked along a leading layer axis.
Layerwise = Callable[[list[str]], bool]
GRAFTS = ("sgd", "adagrad", "rmsprop", "adam", "none")
ROOT_METHODS = ("newton", "eigh")
# "roots": Shampoo's inverse roots; "eigenbasis": SOAP, Adam in the statistics' eigenbases.
PRECONDITIONERS = ("roots", "eigenbasis")


class TensorState(NamedTuple):
    """Shampoo's state for one parameter (SOAP's is ``optim.soap_core.SoapTensorState``)."""

    factor_stats: tuple[jax.Array, ...]  # one [num_blocks, b, b] per full dimension
    factor_roots: tuple[jax.Array, ...]  # their inverse roots in use; identity at first
    diagonal_stats: tuple[jax.Array, ...]  # [num_blocks, b] per diagonal dim, or param-shaped
    graft: Any  # second moment of the graft (param-shaped; () for sgd/none)
    momentum: Any  # param-shaped; () when b1 == 0


class ShampooState(NamedTuple):
    count: jax.Array  # int32: updates applied
    roots_step: jax.Array  # int32: the roots in use come from the statistics after this update
    root_failures: jax.Array  # int32: roots that failed (kept the previous one), in total
    root_error: jax.Array  # float32: largest error estimate of the last refresh
    tensors: Any  # pytree like the params, of TensorState


@dataclasses.dataclass(frozen=True)
class ShampooConfig:
    """Shampoo's static hyperparameters (`optim.shampoo(lr, **fields)`; SOAP: `optim.soap`).

    Attributes:
      b1: momentum (an EMA of the directions); 0 turns it off. ``nesterov``: look ahead.
      b2: EMA factor of the statistics; 1.0 sums them (AdaGrad-like).
      block_size: dimensions larger than this are split into blocks; smaller neighbours merged.
      max_preconditioner_dim: dimensions larger than this get a diagonal factor instead (the
        30,522-word dimension of BERT's embedding table at the default 4096).
      precondition_vectors: parameters of rank <= 1 after merging (biases, LayerNorm scales)
        get an elementwise diagonal preconditioner (True) or the graft's direction alone
        (False, as distributed Shampoo's ``skip_preconditioning_rank_lt=2``).
      elementwise_params: a regular expression searched in each parameter's path (module and
        parameter names joined by "/", e.g. ``bert/embeddings/word_embeddings/embedding``);
        matching parameters are treated as vectors are (SOAP: plain Adam), whatever their rank.
        "" (default): none. Muon's and SOAP's speed-runs keep the embedding table on Adam.
      exponent_override: the root's p (default 2 x the number of preconditioned dimensions).
      ridge_epsilon: roots are of ``L + ridge_epsilon * lambda_max(L) * I``.
      root_method: "newton" (coupled Newton) or "eigh" (eigendecomposition, for comparison).
      root_max_iterations, root_tolerance, root_error_threshold: Newton's iteration cap, its
        stopping error and the error above which a root fails (and the previous one is kept).
      graft: "sgd", "adagrad", "rmsprop", "adam" (RMSProp with Adam's bias correction; the
        momentum is Shampoo's own) or "none": the first-order method giving each block's step
        size; ``graft_b2``/``graft_epsilon`` are its parameters (SOAP: Adam's b2 and eps).
      start_preconditioning_step: updates before this one use the grafted direction alone.
      preconditioning_compute_steps: N, the roots are recomputed every N updates.
      statistics_compute_steps: the Kronecker-factor statistics (``G G^T`` per block and
        dimension: the step's largest matrix products after the model's) are accumulated on
        every this-many-th update only, the updates where roots are due among them (so it must
        divide N); ``b2`` applies per accumulation. 1 (default): every update.
      asynchronous: compute the roots on host threads via ``optim.after_step`` instead of in the
        graph. ``max_staleness`` (0..N, default N): steps a root job may stay in flight before
        ``after_step`` waits for it (0 = wait at once, the synchronous trajectory);
        ``swap_when_done``: swap finished roots in at the first step boundary (True) or exactly
        ``max_staleness`` steps after submission (False, reproducible); ``host_root_dtype``:
        "float32" (as in the graph) or "float64".
      preconditioner: "roots" (Shampoo) or "eigenbasis" (SOAP: Adam in the statistics'
        eigenbases; needs ``graft="none"``, ``nesterov=False``).
    """

    b1: float = 0.9
    nesterov: bool = True
    b2: float = 0.999
    block_size: int = 128
    max_preconditioner_dim: int = 4096
    precondition_vectors: bool = True
    elementwise_params: str = ""
    exponent_override: int | None = None
    ridge_epsilon: float = 1e-6
    root_method: str = "newton"
    root_max_iterations: int = 100
    root_tolerance: float = 1e-6
    root_error_threshold: float = 1e-2
    graft: str = "adam"
    graft_b2: float = 0.999
    graft_epsilon: float = 1e-8
    start_preconditioning_step: int = 1
    preconditioning_compute_steps: int = 10
    statistics_compute_steps: int = 1
    asynchronous: bool = False
    max_staleness: int | None = None
    swap_when_done: bool = True
    host_root_dtype: str = "float32"
    preconditioner: str = "roots"

    def __post_init__(self):
        def check(ok: bool, message: str):
            if not ok:
                raise ValueError(f"shampoo: {message}")

        check(0.0 <= self.b1 < 1.0, f"b1={self.b1} must lie in [0, 1).")
        check(0.0 < self.b2 <= 1.0, f"b2={self.b2} must lie in (0, 1] (1 = sum).")
        check(self.block_size >= 1, f"block_size={self.block_size} must be >= 1.")
        try:
            re.compile(self.elementwise_params)
        except re.error as e:
            check(False, f"elementwise_params={self.elementwise_params!r} is no regex: {e}.")
        check(self.graft in GRAFTS, f"graft={self.graft!r} must be one of {GRAFTS}.")
        check(self.root_method in ROOT_METHODS, f"root_method must be one of {ROOT_METHODS}.")
        check(
            self.preconditioner in PRECONDITIONERS,
            f"preconditioner={self.preconditioner!r} must be one of {PRECONDITIONERS}.",
        )
        check(
            self.preconditioner == "roots" or (self.graft == "none" and not self.nesterov),
            "the eigenbasis preconditioner (SOAP) takes its step size from Adam in the rotated "
            "basis: set graft='none' and nesterov=False.",
        )
        check(
            self.exponent_override is None or self.exponent_override >= 1,
            f"exponent_override={self.exponent_override} must be a positive integer or None.",
        )
        check(self.start_preconditioning_step >= 1, "start_preconditioning_step must be >= 1.")
        check(
            self.preconditioning_compute_steps >= 1, "preconditioning_compute_steps must be >= 1."
        )
        check(
            self.statistics_compute_steps >= 1
            and self.preconditioning_compute_steps % self.statistics_compute_steps == 0,
            f"statistics_compute_steps={self.statistics_compute_steps} must divide "
            f"preconditioning_compute_steps={self.preconditioning_compute_steps}, so that every "
            "root refresh sees the statistics of its own update.",
        )
        check(
            self.host_root_dtype in ("float32", "float64"),
            "host_root_dtype must be 'float32' or 'float64' (float64 needs asynchronous=True).",
        )
        check(
            self.asynchronous or self.host_root_dtype == "float32",
            "host_root_dtype='float64' needs asynchronous=True (roots in the graph are float32).",
        )
        check(
            0 <= self.staleness_bound <= self.preconditioning_compute_steps,
            f"max_staleness={self.max_staleness} must lie in [0, preconditioning_compute_steps="
            f"{self.preconditioning_compute_steps}]: a job must be in before the next one starts.",
        )

    @property
    def staleness_bound(self) -> int:
        """Steps an asynchronous root job may stay in flight (default: until the next is due)."""
        if self.max_staleness is None:
            return self.preconditioning_compute_steps
        return self.max_staleness

    def refresh_due(self, count):
        """Whether the statistics after update ``count`` are due for new roots (int or array)."""
        start, every = self.start_preconditioning_step, self.preconditioning_compute_steps
        return (count >= start) & ((count - start) % every == 0)

    def statistics_due(self, count):
        """Whether update ``count`` (numbered from 1, as in ``refresh_due``) accumulates the
        factor statistics: on S + multiples of ``statistics_compute_steps``, which include the
        refreshes' S + multiples of N."""
        return (count - self.start_preconditioning_step) % self.statistics_compute_steps == 0

    @property
    def eigenbasis(self) -> bool:
        return self.preconditioner == "eigenbasis"

    @property
    def root_solver(self) -> RootSolver:
        return RootSolver(
            self.root_method,
            self.ridge_epsilon,
            self.root_max_iterations,
            self.root_tolerance,
            self.root_error_threshold,
        )

    def plan(
        self, shape: Sequence[int], path: tuple = (), layerwise: Layerwise | None = None
    ) -> BlockPlan:
        """The blocking of a parameter of ``shape`` at pytree ``path`` (``elementwise_params``;
        stacked along a leading layer axis where ``layerwise`` selects its path names)."""
        names = path_names(path)
        stacked = layerwise is not None and layerwise(names)
        if self.elementwise_params and re.search(self.elementwise_params, "/".join(names)):
            return BlockPlan.elementwise_plan(shape, stacked)
        return BlockPlan.create(tuple(shape), self.block_size, self.max_preconditioner_dim, stacked)

    def plans(self, tree: Any, layerwise: Layerwise | None = None) -> list[BlockPlan]:
        """The plan of every leaf of ``tree`` (parameters or their gradients), flat."""
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return [self.plan(leaf.shape, path, layerwise) for path, leaf in leaves]

    def exponent(self, tensor: TensorState) -> int:
        """The root's p for a tensor: 2 x its preconditioned dimensions, or the override."""
        dims = len(tensor.factor_stats) + len(tensor.diagonal_stats)
        return self.exponent_override or 2 * max(dims, 1)


def _is_tensor_state(x: Any) -> bool:
    return isinstance(x, TensorState)


def initial_factors(plan: BlockPlan) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """Zero statistics and identity matrices (roots, or SOAP's bases), one per full dimension."""
    f32 = jnp.float32
    stats = tuple(jnp.zeros(s, f32) for s in plan.factor_shapes)
    return stats, tuple(jnp.broadcast_to(jnp.eye(s[-1], dtype=f32), s) for s in plan.factor_shapes)


def _init_tensor(param: jax.Array, plan: BlockPlan, config: ShampooConfig) -> TensorState:
    f32 = jnp.float32
    stats, roots = initial_factors(plan)
    diagonal = tuple(jnp.zeros(s, f32) for s in plan.diagonal_shapes)
    if plan.elementwise and not config.precondition_vectors:
        diagonal = ()
    graft = () if config.graft in ("sgd", "none") else jnp.zeros(param.shape, f32)
    momentum = jnp.zeros(param.shape, f32) if config.b1 else ()
    return TensorState(stats, roots, diagonal, graft, momentum)


def accumulate(old: jax.Array, new: jax.Array, b2: float) -> jax.Array:
    return old + new if b2 == 1.0 else b2 * old + (1.0 - b2) * new


def updated_factor_stats(blocks, tensor: Any, plan: BlockPlan, count, config):
    """The tensor's (Shampoo's or SOAP's) Kronecker-factor statistics after the update that
    follows ``count`` updates: accumulated when it is due (``config.statistics_due``), else as
    they were."""

    def accumulated():
        return tuple(
            accumulate(stat, factor_statistic(blocks, dim), config.b2)
            for stat, dim in zip(tensor.factor_stats, plan.full_dims)
        )

    if config.statistics_compute_steps == 1 or not tensor.factor_stats:
        return accumulated()
    update = count + 1  # (count: the updates before this one)
    return jax.lax.cond(config.statistics_due(update), accumulated, lambda: tensor.factor_stats)


def _diagonal_root(stat: jax.Array, p: int, ridge_epsilon: float) -> jax.Array:
    """``(d + ridge_epsilon * max d)^(-1/p)`` per block (row of ``stat``), zero where there is
    no statistic."""
    ridged = stat + ridge_epsilon * jnp.max(stat, axis=1, keepdims=True)
    return jnp.where(ridged > 0, ridged ** (-1.0 / p), 0.0)


def _graft_direction(g, graft_state, count, config: ShampooConfig):
    """The first-order direction whose per-block norm sets the step size, and its new state."""
    if config.graft in ("sgd", "none"):
        return g, graft_state
    if config.graft == "adagrad":
        acc = graft_state + jnp.square(g)
        denom = acc
    else:
        acc = accumulate(graft_state, jnp.square(g), config.graft_b2)
        denom = acc
        if config.graft == "adam":
            denom = acc / (1.0 - config.graft_b2 ** (count + 1).astype(jnp.float32))
    return g / (jnp.sqrt(denom) + config.graft_epsilon), acc


def _block_norms(blocks: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(jnp.square(blocks), axis=tuple(range(1, blocks.ndim)), keepdims=True))


def _graft(direction: jax.Array, graft: jax.Array) -> jax.Array:
    """Rescale each block of ``direction`` to the norm of the same block of ``graft``."""
    norm = _block_norms(direction)
    return direction * jnp.where(norm > 0, _block_norms(graft) / jnp.where(norm > 0, norm, 1), 0)


def _tensor_direction(g, tensor: TensorState, plan: BlockPlan, count, config: ShampooConfig):
    """One parameter's preconditioned (and grafted) direction and its new statistics."""
    p = config.exponent(tensor)
    graft_dir, graft_state = _graft_direction(g, tensor.graft, count, config)
    if plan.elementwise and not config.precondition_vectors:
        return graft_dir, tensor._replace(graft=graft_state)
    if plan.elementwise:
        (stat,) = tensor.diagonal_stats
        stat = accumulate(stat, jnp.square(g), config.b2)
        # Treat the whole vector (of each layer, when stacked) as one block.
        rows = (plan.layers, -1)
        root = _diagonal_root(stat.reshape(rows), 2, config.ridge_epsilon)
        shampoo_blocks, graft_blocks = g.reshape(rows) * root, graft_dir.reshape(rows)
        stats, diagonal = (), (stat,)
    else:
        blocks = plan.block(g)
        # (The roots in use come from earlier statistics: this update's feed later roots.)
        stats = updated_factor_stats(blocks, tensor, plan, count, config)
        diagonal = []
        shampoo_blocks = blocks
        full_roots, diag_stats = iter(tensor.factor_roots), iter(tensor.diagonal_stats)
        for dim, is_diagonal in enumerate(plan.diagonal_dims):
            if is_diagonal:
                stat = accumulate(next(diag_stats), diagonal_statistic(blocks, dim), config.b2)
                root = _diagonal_root(stat, p, config.ridge_epsilon)
                shampoo_blocks = apply_diagonal(shampoo_blocks, root, dim)
                diagonal.append(stat)
            else:
                shampoo_blocks = apply_factor(shampoo_blocks, next(full_roots), dim)
        graft_blocks = plan.block(graft_dir)
    if config.graft != "none":
        shampoo_blocks = _graft(shampoo_blocks, graft_blocks)
    if plan.elementwise:
        shampoo_dir = shampoo_blocks.reshape(g.shape)
    else:
        shampoo_dir = plan.unblock(shampoo_blocks)
    direction = jnp.where(count >= config.start_preconditioning_step, shampoo_dir, graft_dir)
    new_tensor = tensor._replace(
        factor_stats=stats, diagonal_stats=tuple(diagonal), graft=graft_state
    )
    return direction, new_tensor


def factor_lists(tensors: Any, config: ShampooConfig):
    """All full factors of a state, flat: ``(stats, roots, exponents)`` in a fixed order."""
    stats, roots, exponents = [], [], []
    for tensor in jax.tree.leaves(tensors, is_leaf=_is_tensor_state):
        stats.extend(tensor.factor_stats)
        roots.extend(tensor.factor_roots)
        exponents.extend([config.exponent(tensor)] * len(tensor.factor_stats))
    return stats, roots, tuple(exponents)


def with_factor_roots(tensors: Any, roots: Sequence[jax.Array]) -> Any:
    """``tensors`` with their factor roots replaced, in :func:`factor_lists` order."""
    flat, treedef = jax.tree.flatten(tensors, is_leaf=_is_tensor_state)
    roots = iter(roots)
    flat = [t._replace(factor_roots=tuple(next(roots) for _ in t.factor_roots)) for t in flat]
    return jax.tree.unflatten(treedef, flat)


@dataclasses.dataclass(frozen=True)
class RootSolver:
    """How inverse roots are computed (hashable: a static argument of the jitted host solver)."""

    method: str = "newton"
    ridge_epsilon: float = 1e-6
    max_iterations: int = 100
    tolerance: float = 1e-6
    error_threshold: float = 1e-2

    def __call__(self, a: jax.Array, p: int) -> matrix_roots.SolveResult:
        if self.method == "eigh":
            return matrix_roots.inverse_pth_root_eigh(a, p, ridge_epsilon=self.ridge_epsilon)
        return matrix_roots.inverse_pth_root(
            a,
            p,
            ridge_epsilon=self.ridge_epsilon,
            max_iterations=self.max_iterations,
            tolerance=self.tolerance,
            error_threshold=self.error_threshold,
        )


def compute_roots(stats, old_roots, exponents: tuple[int, ...], solver: RootSolver):
    """New inverse roots for flat lists of statistics (keeping the old root where one fails).

    Returns ``(roots, failures, max_error)``, the error over the roots taken. The same function
    runs in the graph and on the host.
    """
    return solve_factors(stats, old_roots, exponents, solver)


def solve_factors(
    stats,
    old: Sequence[jax.Array],
    exponents: Sequence[int],
    solve: Callable[[jax.Array, int], matrix_roots.SolveResult],
):
    """``solve(stat, p)`` for flat lists of statistics and exponents, keeping the ``old`` matrix
    where a solve fails or has nothing to compute.

    Matrices of equal size and exponent are stacked and solved in one vmapped call. Returns
    ``(matrices, failures, max_error)``, the error over the matrices taken.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (s, p) in enumerate(zip(stats, exponents)):
        groups.setdefault((s.shape[-1], p), []).append(i)
    matrices = list(old)
    failures = jnp.zeros((), jnp.int32)
    max_error = jnp.zeros((), jnp.float32)
    for (_, p), members in groups.items():
        stacked = jnp.concatenate([stats[i] for i in members])
        result = jax.vmap(functools.partial(solve, p=p))(stacked)
        take = result.ok & result.updated
        failures += jnp.sum(result.updated & ~result.ok).astype(jnp.int32)
        errors = jnp.where(take, result.error, 0.0).astype(jnp.float32)
        max_error = jnp.maximum(max_error, jnp.max(errors))
        offset = 0
        for i in members:
            n = stats[i].shape[0]
            keep = take[offset : offset + n, None, None]
            new = result.matrix[offset : offset + n].astype(old[i].dtype)
            matrices[i] = jnp.where(keep, new, old[i])
            offset += n
    return matrices, failures, max_error


def _refresh_in_graph(state: ShampooState, tensors: Any, config: ShampooConfig):
    """The synchronous mode's refresh: new roots when the statistics after this update are due."""
    stats, roots, exponents = factor_lists(tensors, config)
    if not stats:
        return tensors, state.roots_step, state.root_failures, state.root_error
    count = state.count + 1

    def refresh():
        new_roots, failures, error = compute_roots(stats, roots, exponents, config.root_solver)
        new_tensors = with_factor_roots(tensors, new_roots)
        return new_tensors, count, state.root_failures + failures, error

    def keep():
        return tensors, state.roots_step, state.root_failures, state.root_error

    return lax.cond(config.refresh_due(count), refresh, keep)


def scale_by_shampoo(
    config: ShampooConfig, layerwise: Layerwise | None = None
) -> optax.GradientTransformation:
    """Shampoo's direction with grafting, momentum and (unmasked) bookkeeping, no lr/decay;
    the leaves `layerwise` selects are stacked layers, preconditioned layer by layer."""

    def init_fn(params):
        treedef = jax.tree.structure(params)
        leaves = zip(jax.tree.leaves(params), config.plans(params, layerwise))
        tensors = treedef.unflatten([_init_tensor(p, plan, config) for p, plan in leaves])
        zero = jnp.zeros((), jnp.int32)
        return ShampooState(zero, zero, zero, jnp.zeros((), jnp.float32), tensors)

    def update_fn(updates, state, params=None):
        del params
        count = state.count
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), updates)
        treedef = jax.tree.structure(grads)
        tensors = treedef.flatten_up_to(state.tensors)
        results = [
            _tensor_direction(g, t, plan, count, config)
            for g, t, plan in zip(
                treedef.flatten_up_to(grads), tensors, config.plans(grads, layerwise)
            )
        ]
        new_tensors = []
        directions = []
        for (direction, tensor), g in zip(results, jax.tree.leaves(updates)):
            if config.b1:
                momentum = config.b1 * tensor.momentum + (1.0 - config.b1) * direction
                tensor = tensor._replace(momentum=momentum)
                if config.nesterov:
                    direction = config.b1 * momentum + (1.0 - config.b1) * direction
                else:
                    direction = momentum
            new_tensors.append(tensor)
            directions.append(direction.astype(g.dtype))
        new_tensors = jax.tree.unflatten(treedef, new_tensors)
        roots_step, failures, error = state.roots_step, state.root_failures, state.root_error
        if not config.asynchronous:
            new_tensors, roots_step, failures, error = _refresh_in_graph(state, new_tensors, config)
        new_state = ShampooState(count + 1, roots_step, failures, error, new_tensors)
        return jax.tree.unflatten(treedef, directions), new_state

    return optax.GradientTransformation(init_fn, update_fn)
