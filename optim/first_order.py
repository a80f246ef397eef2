"""First-order optimizers with the BERT recipe's defaults, and the packing adjustment."""

from __future__ import annotations

from typing import Any

import optax

from optim.masks import weight_decay_mask

MaskOrFn = Any  # a pytree of bools like the params, a callable params -> such a tree, or None


def adjust_betas_for_packing(b1: float, b2: float, packing_factor: float) -> tuple[float, float]:
    """Raise Adam/LAMB betas to the packing factor: ``(b1**pf, b2**pf)``.

    A packed batch holds ``packing_factor`` (pf) times as many sequences as an unpacked one, so
    one packed step stands for about pf unpacked steps; decaying the moment estimates by ``b**pf``
    per step keeps their memory the same in sequences (Kosec et al., 2021, "Efficient sequence
    packing without cross-contamination").
    """
    for name, beta in (("b1", b1), ("b2", b2)):
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"{name}={beta} must lie in [0, 1].")
    if packing_factor < 1.0:
        raise ValueError(
            f"packing_factor={packing_factor} must be >= 1 (sequences per packed row on average; "
            "use 1.0 for unpacked data)."
        )
    return b1**packing_factor, b2**packing_factor


def sgd(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.9,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    mask: MaskOrFn = weight_decay_mask,
) -> optax.GradientTransformation:
    """SGD with (optionally Nesterov) momentum; ``weight_decay`` is L2 added to the gradient."""
    return optax.chain(
        optax.add_decayed_weights(weight_decay, mask),
        optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov),
    )


def adamw(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    mask: MaskOrFn = weight_decay_mask,
) -> optax.GradientTransformation:
    """AdamW (decoupled weight decay) with BERT's defaults."""
    return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask)


def lamb(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    mask: MaskOrFn = weight_decay_mask,
) -> optax.GradientTransformation:
    """optax's LAMB (You et al., 2019) with BERT's defaults and no decay on norms and biases.

    The layer-wise trust ratio applies to every parameter, as in ``optax.lamb``.
    """
    return optax.lamb(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask)
