"""``optim.create``: one entry point from a config (or a name and keyword args) to an optimizer."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
import optax
from ml_collections.config_dict import placeholder

from optim.first_order import adamw, lamb, sgd
from optim.host import HostTransformation
from optim.layerwise import ELEMENTWISE, OWN_LAYERWISE
from optim.layerwise import layerwise as per_layer
from optim.muon import muon
from optim.shampoo import shampoo
from optim.soap import soap

OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "sgd": sgd,
    "adamw": adamw,
    "lamb": lamb,
    "muon": muon,
    "shampoo": shampoo,
    "soap": soap,
}


def register(name: str, builder: Callable[..., optax.GradientTransformation]) -> None:
    """Make ``builder(learning_rate, **hparams)`` available as ``optim.create(name, ...)``."""
    OPTIMIZERS[name] = builder


# Builder arguments a config does not hold: the schedule, the weight-decay mask and the stacked
# layers' selector come from code.
NOT_IN_CONFIG = ("learning_rate", "mask", "layerwise")


def hyperparameters(name: str) -> dict[str, inspect.Parameter]:
    """The configurable arguments of optimizer `name`'s builder, with their defaults."""
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; registered: {sorted(OPTIMIZERS)}.")
    parameters = inspect.signature(OPTIMIZERS[name], eval_str=True).parameters
    return {k: p for k, p in parameters.items() if k not in NOT_IN_CONFIG}


def _config_field(parameter: inspect.Parameter) -> Any:
    """The default, or for a None default a placeholder of the annotated type."""
    if parameter.default is not None:
        return parameter.default
    kinds = [t for t in getattr(parameter.annotation, "__args__", ()) if t is not type(None)]
    if isinstance(parameter.annotation, types.UnionType) and len(kinds) == 1:
        return placeholder(kinds[0])
    return placeholder(object)


def config_section(name: str = "lamb") -> ml_collections.ConfigDict:
    """`config.optimizer`: `name` picks the optimizer; one section per registered optimizer holds
    all its hyper-parameters at their defaults (`--config.optimizer.shampoo.block_size=256`)."""
    section = ml_collections.ConfigDict({"name": name})
    for optimizer in OPTIMIZERS:
        fields = {k: _config_field(p) for k, p in hyperparameters(optimizer).items()}
        section[optimizer] = ml_collections.ConfigDict(fields)
    return section


def settings_of(config: Any) -> tuple[str, dict[str, Any]]:
    """(name, hyper-parameters) of an optimizer config: its `name` and that optimizer's section
    (the other optimizers' sections are dropped; placeholders left unset mean the default).
    Flat configs (`{"name": "lamb", "b1": 0.9}`) work too."""
    if hasattr(config, "to_dict"):  # ml_collections.ConfigDict
        settings = dict(config.to_dict())
    elif isinstance(config, Mapping):
        settings = dict(config)
    else:
        raise TypeError(
            "optim.create expects an optimizer name or a config with a `name` field, got "
            f"{config!r}."
        )
    if "name" not in settings:
        raise ValueError(f"Optimizer config {settings} has no `name` (one of {list(OPTIMIZERS)}).")
    name = settings.pop("name")
    sections = {k: settings.pop(k) for k in list(settings) if isinstance(settings[k], Mapping)}
    settings.update(sections.get(name, {}))
    return name, {k: v for k, v in settings.items() if v is not None}


def create(
    name_or_config: Any, *, layerwise: Callable[[list[str]], bool] | None = None, **hparams: Any
) -> optax.GradientTransformation:
    """Build the optimizer ``name`` (a key of `OPTIMIZERS`) with its hyperparameters.

    ``name_or_config`` is a name, or a ``ConfigDict``/dict holding ``name`` and hyperparameters
    (flat, or in a section named after the optimizer as ``config_section`` builds it); keyword
    arguments override the config. ``learning_rate`` may be a float or an optax schedule.
    ``grad_clip_norm`` (any optimizer) clips the gradients' global norm first. ``layerwise``
    selects, by parameter path names, leaves stacked along a leading layer axis, which the
    optimizer then updates slice by slice (`optim.layerwise`; element-wise ones need not,
    Shampoo and SOAP block each layer on its own).

        tx = optim.create("lamb", learning_rate=optax.linear_schedule(0.0, 1e-3, 1000))
    """
    if isinstance(name_or_config, str):
        name, settings = name_or_config, {}
    else:
        name, settings = settings_of(name_or_config)
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
    if layerwise is not None and name in OWN_LAYERWISE:
        settings["layerwise"] = layerwise
    tx = builder(**settings)
    if layerwise is not None and name not in ELEMENTWISE + OWN_LAYERWISE:
        tx = per_layer(tx, layerwise)
    if clip_norm is None:
        return tx
    clipped = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
    host = getattr(tx, "host", None)
    return clipped if host is None else HostTransformation(clipped.init, clipped.update, host)
