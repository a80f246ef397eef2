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

import dataclasses
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

import optax

from optim.first_order import MaskOrFn
from optim.host import HostTransformation
from optim.masks import weight_decay_mask
from optim.shampoo_core import Layerwise, ShampooConfig, scale_by_shampoo
from optim.shampoo_host import ShampooHost, SoapHost
from optim.soap_core import scale_by_soap


def shampoo(
    learning_rate: optax.ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    mask: MaskOrFn = weight_decay_mask,
    layerwise: Layerwise | None = None,
    **options: Any,
) -> HostTransformation:
    """Shampoo with grafting, momentum and decoupled weight decay.

    Args:
      learning_rate: a float or an optax schedule (of the update count).
      weight_decay, mask: decoupled weight decay and where it applies (see
        ``weight_decay_mask``).
      layerwise: selects, by path names, the leaves stacked along a leading layer axis (a
        scanned model's layers): each layer gets its own statistics and roots, as unstacked.
      **options: fields of :class:`~optim.shampoo_core.ShampooConfig` (meanings and defaults
        there), e.g. ``block_size=128, preconditioning_compute_steps=10, asynchronous=True``.

    Returns:
      A :class:`~optim.host.HostTransformation`; its ``host`` runs the asynchronous roots and
      reports metrics (``optim.host_metrics``).
    """
    return from_config(ShampooConfig(**options), learning_rate, weight_decay, mask, layerwise)


def with_config_fields(builder: Callable, fields: Sequence[str]) -> Callable:
    """``builder`` (which takes ``**options``) with a signature that lists ``ShampooConfig``'s
    ``fields`` as keyword arguments at their defaults: what ``optim.create`` validates against
    and ``config.optimizer`` sections are built from, so the defaults have one home."""
    hints = typing.get_type_hints(ShampooConfig)
    defaults = {f.name: f.default for f in dataclasses.fields(ShampooConfig)}
    own = inspect.signature(builder, eval_str=True).parameters.values()
    builder.__signature__ = inspect.Signature(
        [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
        + [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=defaults[name], annotation=hints[name]
            )
            for name in fields
        ],
        return_annotation=HostTransformation,
    )
    return builder


# Every field but the preconditioner: the eigenbasis mode is `optim.soap`.
with_config_fields(
    shampoo, [f.name for f in dataclasses.fields(ShampooConfig) if f.name != "preconditioner"]
)


def from_config(
    config: ShampooConfig,
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float = 0.0,
    mask: MaskOrFn = weight_decay_mask,
    layerwise: Layerwise | None = None,
) -> HostTransformation:
    """The transformation of ``config`` (Shampoo or, ``config.eigenbasis``, SOAP), decoupled
    weight decay and the learning rate, with its host side."""
    scale, host = (
        (scale_by_soap, SoapHost) if config.eigenbasis else (scale_by_shampoo, ShampooHost)
    )
    tx = optax.chain(
        scale(config, layerwise),
        optax.add_decayed_weights(weight_decay, mask),
        optax.scale_by_learning_rate(learning_rate),
    )
    return HostTransformation(tx.init, tx.update, host(config))
