"""Host-side work of an optimizer, run by the train loop between jitted steps.

Most optimizers have none. One that does (Shampoo with asynchronous roots) is returned by
:func:`optim.create` as a :class:`HostTransformation`: an ordinary ``optax`` gradient
transformation (a NamedTuple of ``init``/``update``, so it works with ``optax.chain``,
``optax.MultiSteps`` and flax's ``TrainState``) that also carries a ``host`` object. The train
loop calls, outside jit, after every optimizer update::

    opt_state = optim.after_step(tx, opt_state, step)
    metrics.update(optim.host_metrics(tx, opt_state))   # when logging

``tx`` must be the object :func:`optim.create` returned (wrapping it in ``optax.chain`` drops the
``host`` attribute), but ``opt_state`` may be the state of any wrapper around it: the host finds
its own sub-state wherever it sits.
"""

from __future__ import annotations

from typing import Any, Protocol

import optax


class HostHooks(Protocol):
    """What the train loop may call on an optimizer's host side."""

    def after_step(self, opt_state: Any, step: int) -> Any: ...

    def metrics(self, opt_state: Any) -> dict[str, float]: ...

    def reset(self) -> None: ...


class HostTransformation(optax.GradientTransformationExtraArgs):
    """A gradient transformation plus the host object that does its between-steps work."""

    host: HostHooks

    def __new__(cls, init: Any, update: Any, host: HostHooks) -> HostTransformation:
        tx = super().__new__(cls, init, update)
        tx.host = host
        return tx


def after_step(tx: Any, opt_state: Any, step: int) -> Any:
    """Run ``tx``'s host work after optimizer update number ``step``; returns the new opt_state.

    A no-op (returns ``opt_state`` itself) for optimizers without host work. ``step`` only needs to
    increase by one per loop step (a step skipped as not finite included); a jump (e.g. after
    restoring a checkpoint) makes the host drop its in-flight work and resynchronise with the state.
    """
    host = getattr(tx, "host", None)
    return opt_state if host is None else host.after_step(opt_state, step)


def host_metrics(tx: Any, opt_state: Any) -> dict[str, float]:
    """Host-side metrics of ``tx`` (e.g. Shampoo's root failures, staleness, root seconds)."""
    host = getattr(tx, "host", None)
    return {} if host is None else host.metrics(opt_state)
