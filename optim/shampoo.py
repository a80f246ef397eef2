"""Shampoo (Gupta et al., 2018; Anil et al., 2020) as an optax gradient transformation.

The algorithm, its state and the schedule of the roots are described in
:mod:`optim.shampoo_core`; the asynchronous root worker in :mod:`optim.shampoo_host`.

    tx = optim.shampoo(1e-3, preconditioning_compute_steps=10, asynchronous=True)
    opt_state = tx.init(params)
    for step in range(num_steps):
        params, opt_state = train_step(params, opt_state, batch)   # jitted, tx.update inside
        opt_state = optim.after_step(tx, opt_state, step)          # hands off / swaps in roots
"""

from __future__ import annotations

import optax

from optim.first_order import MaskOrFn
from optim.host import HostTransformation
from optim.masks import weight_decay_mask
from optim.shampoo_core import ShampooConfig, scale_by_shampoo
from optim.shampoo_host import ShampooHost


def shampoo(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    nesterov: bool = True,
    b2: float = 0.999,
    block_size: int = 128,
    max_preconditioner_dim: int = 4096,
    precondition_vectors: bool = True,
    exponent_override: int | None = None,
    ridge_epsilon: float = 1e-6,
    root_method: str = "newton",
    root_max_iterations: int = 100,
    root_tolerance: float = 1e-6,
    root_error_threshold: float = 1e-2,
    graft: str = "adam",
    graft_b2: float = 0.999,
    graft_epsilon: float = 1e-8,
    weight_decay: float = 0.0,
    mask: MaskOrFn = weight_decay_mask,
    start_preconditioning_step: int = 1,
    preconditioning_compute_steps: int = 10,
    asynchronous: bool = False,
    max_staleness: int | None = None,
    swap_when_done: bool = True,
    host_root_dtype: str = "float32",
) -> HostTransformation:
    """Shampoo with grafting, momentum and decoupled weight decay.

    Args:
      learning_rate: a float or an optax schedule (of the update count).
      b1: momentum (an EMA of the directions); 0 turns it off. ``nesterov``: look ahead.
      b2: EMA factor of the statistics; 1.0 sums them (AdaGrad-like).
      block_size: dimensions larger than this are split into blocks; smaller neighbours merged.
      max_preconditioner_dim: dimensions larger than this get a diagonal factor instead (the
        30,522-word dimension of BERT's embedding table at the default 4096).
      precondition_vectors: parameters of rank <= 1 after merging (biases, LayerNorm scales)
        get an elementwise diagonal preconditioner (True) or the graft's direction alone
        (False, as distributed Shampoo's ``skip_preconditioning_rank_lt=2``).
      exponent_override: the root's p (default 2 x the number of preconditioned dimensions).
      ridge_epsilon: roots are of ``L + ridge_epsilon * lambda_max(L) * I``.
      root_method: "newton" (coupled Newton) or "eigh" (eigendecomposition, for comparison).
      root_max_iterations, root_tolerance, root_error_threshold: Newton's iteration cap, its
        stopping error and the error above which a root fails (and the previous one is kept).
      graft: "sgd", "adagrad", "rmsprop", "adam" (RMSProp with Adam's bias correction; the
        momentum is Shampoo's own) or "none": the first-order method giving each block's step
        size; ``graft_b2``/``graft_epsilon`` are its parameters.
      weight_decay, mask: decoupled weight decay and where it applies (see ``weight_decay_mask``).
      start_preconditioning_step: updates before this one use the grafted direction alone.
      preconditioning_compute_steps: N, the roots are recomputed every N updates.
      asynchronous: compute the roots on host threads via ``optim.after_step`` instead of in the
        graph. ``max_staleness`` (0..N, default N): steps a root job may stay in flight before
        ``after_step`` waits for it (0 = wait at once, the synchronous trajectory);
        ``swap_when_done``: swap finished roots in at the first step boundary (True) or exactly
        ``max_staleness`` steps after submission (False, reproducible); ``host_root_dtype``:
        "float32" (as in the graph) or "float64".

    Returns:
      A :class:`~optim.host.HostTransformation`; its ``host`` runs the asynchronous roots and
      reports metrics (``optim.host_metrics``).
    """
    config = ShampooConfig(
        b1=b1,
        nesterov=nesterov,
        b2=b2,
        block_size=block_size,
        max_preconditioner_dim=max_preconditioner_dim,
        precondition_vectors=precondition_vectors,
        exponent_override=exponent_override,
        ridge_epsilon=ridge_epsilon,
        root_method=root_method,
        root_max_iterations=root_max_iterations,
        root_tolerance=root_tolerance,
        root_error_threshold=root_error_threshold,
        graft=graft,
        graft_b2=graft_b2,
        graft_epsilon=graft_epsilon,
        start_preconditioning_step=start_preconditioning_step,
        preconditioning_compute_steps=preconditioning_compute_steps,
        asynchronous=asynchronous,
        max_staleness=max_staleness,
        swap_when_done=swap_when_done,
        host_root_dtype=host_root_dtype,
    )
    return from_config(config, learning_rate, weight_decay, mask)


def from_config(
    config: ShampooConfig,
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float = 0.0,
    mask: MaskOrFn = weight_decay_mask,
) -> HostTransformation:
    """The transformation of ``config`` (Shampoo or SOAP), decoupled weight decay and the
    learning rate, with its host side."""
    tx = optax.chain(
        scale_by_shampoo(config),
        optax.add_decayed_weights(weight_decay, mask),
        optax.scale_by_learning_rate(learning_rate),
    )
    return HostTransformation(tx.init, tx.update, ShampooHost(config))
