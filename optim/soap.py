"""SOAP (Vyas et al., arXiv 2409.11321): Adam in the eigenbases of Shampoo's statistics.

Configured as a mode of Shampoo (``ShampooConfig.preconditioner="eigenbasis"``): the statistics,
the blocking and the asynchronous host machinery are Shampoo's (:mod:`optim.shampoo_core`,
:mod:`optim.shampoo_host`), the state, update and eigenbasis refresh SOAP's own
(:mod:`optim.soap_core`). Per block of a matrix gradient ``G``:

* statistics ``L <- s L + (1 - s) G G^T``, ``R <- s R + (1 - s) G^T G`` (``s = shampoo_b2``);
* every N updates, the eigenbases ``Q_L``, ``Q_R`` of ``L`` and ``R`` (``eigh``, columns by
  decreasing eigenvalue), in the graph or, with ``asynchronous=True``, on a host thread while
  the accelerator trains on with the previous ones; Adam's moments are turned into the new
  basis when it is adopted (``optim.soap_core.adopt_bases``);
* Adam on the rotated gradient ``Q_L^T G Q_R`` (first and second moments kept in the rotated
  basis, bias-corrected), its step ``Q_L (m / (sqrt(v) + eps)) Q_R^T`` rotated back; no grafting.

Vectors, dimensions longer than ``max_preconditioner_dim`` (BERT's 30,522-word embedding
axis) and the parameters ``elementwise_params`` names keep the identity basis: plain Adam
there. Before the first basis arrives SOAP is Adam.

    tx = optim.soap(3e-3, preconditioning_compute_steps=10, asynchronous=True)
"""

from __future__ import annotations

from typing import Any

import optax

from optim.first_order import MaskOrFn
from optim.host import HostTransformation
from optim.masks import weight_decay_mask
from optim.shampoo import from_config, with_config_fields
from optim.shampoo_core import Layerwise, ShampooConfig


def soap(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float = 0.95,
    b2: float = 0.95,
    shampoo_b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    mask: MaskOrFn = weight_decay_mask,
    layerwise: Layerwise | None = None,
    **options: Any,
) -> HostTransformation:
    """SOAP with decoupled weight decay (defaults: the paper's).

    Args:
      learning_rate: a float or an optax schedule (of the update count).
      b1, b2, eps: Adam's, in the rotated basis (b1 = 0 turns the first moment off).
      shampoo_b2: EMA factor of the statistics L and R (1.0 sums them).
      weight_decay, mask: decoupled weight decay and where it applies.
      layerwise: leaves stacked along a leading layer axis, per layer (as ``optim.shampoo``).
      **options: the ``SHARED_FIELDS`` of :class:`~optim.shampoo_core.ShampooConfig`: its
        blocking, and when and where the eigenbases are computed (the first from the
        statistics after update ``start_preconditioning_step``, then every
        ``preconditioning_compute_steps``; ``asynchronous`` on a host thread like Shampoo's
        roots, ``optim.after_step`` after every update).
    """
    unknown = sorted(set(options) - set(SHARED_FIELDS))
    if unknown:
        raise TypeError(f"soap() got unknown options {unknown}; it takes {SHARED_FIELDS}.")
    config = ShampooConfig(
        b1=b1,
        nesterov=False,
        b2=shampoo_b2,
        graft="none",
        graft_b2=b2,
        graft_epsilon=eps,
        preconditioner="eigenbasis",
        **options,
    )
    return from_config(config, learning_rate, weight_decay, mask, layerwise)


# ShampooConfig fields SOAP takes as they are (the others are fixed above or renamed: Adam's
# b2 and eps are the graft's, the statistics' b2 is `shampoo_b2`).
SHARED_FIELDS = (
    "block_size",
    "max_preconditioner_dim",
    "elementwise_params",
    "start_preconditioning_step",
    "preconditioning_compute_steps",
    "statistics_compute_steps",
    "asynchronous",
    "max_staleness",
    "swap_when_done",
    "host_root_dtype",
)
with_config_fields(soap, SHARED_FIELDS)
