"""``optim.create``: one entry point from a config (or a name and keyword args) to an optimizer."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import optax

from optim import first_order, shampoo
from optim.host import HostTransformation

OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "sgd": first_order.sgd,
    "adamw": first_order.adamw,
    "lamb": first_order.lamb,
    "shampoo": shampoo.shampoo,
}


def register(name: str, builder: Callable[..., optax.GradientTransformation]) -> None:
    """Make ``builder(learning_rate, **hparams)`` available as ``optim.create(name, ...)``."""
    OPTIMIZERS[name] = builder


def _as_dict(config: Any) -> dict[str, Any]:
    if hasattr(config, "to_dict"):  # ml_collections.ConfigDict
        return dict(config.to_dict())
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(
        f"optim.create expects an optimizer name or a config with a `name` field, got {config!r}."
    )


def create(name_or_config: Any, **hparams: Any) -> optax.GradientTransformation:
    """Build the optimizer ``name`` (sgd, adamw, lamb, shampoo) with its hyperparameters.

    ``name_or_config`` is a name, or a ``ConfigDict``/dict holding ``name`` and hyperparameters;
    keyword arguments override the config. ``learning_rate`` may be a float or an optax schedule.
    ``grad_clip_norm`` (any optimizer) clips the gradients' global norm first.

        tx = optim.create("lamb", learning_rate=optax.linear_schedule(0.0, 1e-3, 1000))
    """
    if isinstance(name_or_config, str):
        name, settings = name_or_config, {}
    else:
        settings = _as_dict(name_or_config)
        if "name" not in settings:
            raise ValueError(
                f"Optimizer config {settings} has no `name` (one of {list(OPTIMIZERS)})."
            )
        name = settings.pop("name")
    settings.update(hparams)
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; registered: {sorted(OPTIMIZERS)}.")
    builder = OPTIMIZERS[name]
    clip_norm = settings.pop("grad_clip_norm", None)
    accepted = inspect.signature(builder).parameters
    unknown = sorted(set(settings) - set(accepted))
    if unknown:
        raise ValueError(
            f"Unknown hyperparameters {unknown} for optimizer {name!r}; it accepts "
            f"{sorted(accepted)} (plus grad_clip_norm)."
        )
    if "learning_rate" not in settings:
        raise ValueError(
            f"Optimizer {name!r} needs a learning_rate (a float or an optax schedule)."
        )
    tx = builder(**settings)
    if clip_norm is None:
        return tx
    clipped = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
    host = getattr(tx, "host", None)
    return clipped if host is None else HostTransformation(clipped.init, clipped.update, host)
