"""An optimizer applied layer by layer to parameters stacked along a leading layer axis.

A model whose identical layers run as one scan (`BertConfig.scan_layers`) keeps each layer's
parameter as one slice of a stacked array [layers, ...]. Element-wise optimizers do not care,
but LAMB's trust ratio, Muon's orthogonalisation and weight-decay masks are defined per
parameter: `layerwise` runs the transformation on each slice (`jax.vmap` over the leading
axis of the leaves `stacked` selects), so a stacked model takes the same steps as the unrolled
one; the other leaves go through the transformation as they are.

    tx = layerwise(optim.create("lamb", learning_rate=1e-3), lambda names: "layers" in names)
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import optax

from optim.masks import path_names

# Optimizers whose step of a leaf depends on nothing but its own elements (and its path): they
# need no slicing, and get none.
ELEMENTWISE = ("adamw", "sgd")
# Optimizers that take the selector themselves (a `layerwise` argument) rather than `jax.vmap`:
# Shampoo's and SOAP's root / eigenbasis refreshes are step-counted branches (a vmapped branch
# runs both sides every step) and host jobs, so they cut each stacked leaf's blocks per layer
# instead (`optim.shampoo_blocks`) and refresh every layer's roots in one job.
OWN_LAYERWISE = ("shampoo", "soap")


def layerwise(
    tx: optax.GradientTransformation, stacked: Callable[[list[str]], bool]
) -> optax.GradientTransformation:
    """`tx` per slice of the leaves whose path names `stacked` selects (see the module doc)."""
    per_slice = optax.GradientTransformationExtraArgs(
        jax.vmap(tx.init), jax.vmap(lambda u, s, p: tx.update(u, s, p))
    )

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "stacked" if stacked(path_names(path)) else "other", params
        )

    return optax.multi_transform({"stacked": per_slice, "other": tx}, labels)
