"""SOAP (Vyas et al., arXiv 2409.11321): Adam in the eigenbases of Shampoo's statistics.

A mode of Shampoo (``ShampooConfig.preconditioner="eigenbasis"``), so the statistics, the
blocking and the asynchronous host machinery are Shampoo's (:mod:`optim.shampoo_core`,
:mod:`optim.shampoo_host`). Per block of a matrix gradient ``G``:

* statistics ``L <- s L + (1 - s) G G^T``, ``R <- s R + (1 - s) G^T G`` (``s = shampoo_b2``);
* every N updates, the eigenbases ``Q_L``, ``Q_R`` of ``L`` and ``R`` (``eigh``, columns by
  decreasing eigenvalue), in the graph or, with ``asynchronous=True``, on a host thread while
  the accelerator trains on with the previous ones; Adam's moments are turned into the new
  basis when it is adopted (``optim.shampoo_core.adopt_bases``);
* Adam on the rotated gradient ``Q_L^T G Q_R`` (first and second moments kept in the rotated
  basis, bias-corrected), its step ``Q_L (m / (sqrt(v) + eps)) Q_R^T`` rotated back; no grafting.

Vectors, and dimensions longer than ``max_preconditioner_dim`` (BERT's 30,522-word embedding
axis), keep the identity basis: plain Adam there. Before the first basis arrives SOAP is Adam.

    tx = optim.soap(3e-3, preconditioning_compute_steps=10, asynchronous=True)
"""

from __future__ import annotations

import optax

from optim.first_order import MaskOrFn
from optim.host import HostTransformation
from optim.masks import weight_decay_mask
from optim.shampoo import from_config
from optim.shampoo_core import ShampooConfig


def soap(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.95,
    b2: float = 0.95,
    shampoo_b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    mask: MaskOrFn = weight_decay_mask,
    block_size: int = 128,
    max_preconditioner_dim: int = 4096,
    start_preconditioning_step: int = 1,
    preconditioning_compute_steps: int = 10,
    asynchronous: bool = False,
    max_staleness: int | None = None,
    swap_when_done: bool = True,
    host_root_dtype: str = "float32",
) -> HostTransformation:
    """SOAP with decoupled weight decay (defaults: the paper's).

    Args:
      learning_rate: a float or an optax schedule (of the update count).
      b1, b2, eps: Adam's, in the rotated basis (b1 = 0 turns the first moment off).
      shampoo_b2: EMA factor of the statistics L and R (1.0 sums them).
      weight_decay, mask: decoupled weight decay and where it applies.
      block_size, max_preconditioner_dim: Shampoo's blocking (see ``optim.shampoo``).
      start_preconditioning_step, preconditioning_compute_steps: the first basis is computed
        from the statistics after update S, then every N updates.
      asynchronous, max_staleness, swap_when_done, host_root_dtype: as Shampoo's roots, for the
        eigenbases (``optim.after_step`` after every update).
    """
    config = ShampooConfig(
        b1=b1,
        nesterov=False,
        b2=shampoo_b2,
        block_size=block_size,
        max_preconditioner_dim=max_preconditioner_dim,
        graft="none",
        graft_b2=b2,
        graft_epsilon=eps,
        start_preconditioning_step=start_preconditioning_step,
        preconditioning_compute_steps=preconditioning_compute_steps,
        asynchronous=asynchronous,
        max_staleness=max_staleness,
        swap_when_done=swap_when_done,
        host_root_dtype=host_root_dtype,
        preconditioner="eigenbasis",
    )
    return from_config(config, learning_rate, weight_decay, mask)
