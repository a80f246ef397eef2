"""Muon (Jordan et al., 2024): momentum orthogonalised by Newton-Schulz iterations, from optax.

`optax.contrib.muon` orthogonalises the update of each weight matrix it is given and runs AdamW
on every other parameter. Which matrices get Muon is the one decision left to us; Muon's
authors keep it to the hidden layers' weight matrices, so here (`muon_matrices`) that is every
2-D `kernel` except the classifiers' (NSP, fine-tuning heads: outputs, like the MLM decoder,
which is tied to the word embeddings). Embeddings, biases, LayerNorm, the relative-position
table and block-sparse blocks (3-D) go to AdamW.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from optax.contrib import MuonDimensionNumbers

from optim.first_order import MaskOrFn
from optim.masks import path_names, weight_decay_mask


def is_muon_matrix(names: list[str], leaf: Any) -> bool:
    """Whether a parameter with this path gets Muon (see the module doc)."""
    return (
        bool(names)
        and names[-1] == "kernel"
        and getattr(leaf, "ndim", 0) == 2
        and not any("classifier" in name for name in names[:-1])
    )


def muon_matrices(params: Any) -> Any:
    """optax's `muon_weight_dimension_numbers`: a matrix's default numbers (rows reduced,
    columns out, as flax's Dense kernels are laid out) where `is_muon_matrix`, else None."""

    def numbers(path: tuple, leaf: Any) -> MuonDimensionNumbers | None:
        return MuonDimensionNumbers() if is_muon_matrix(path_names(path), leaf) else None

    return jax.tree_util.tree_map_with_path(numbers, params)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    beta: float = 0.95,
    ns_steps: int = 5,
    nesterov: bool = True,
    weight_decay: float = 0.01,
    consistent_rms: float | None = 0.2,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_weight_decay: float = 0.0,
    eps: float = 1e-8,
    mask: MaskOrFn = weight_decay_mask,
) -> optax.GradientTransformation:
    """optax's Muon on the hidden layers' matrices (`muon_matrices`), AdamW on the rest.

    Args:
      learning_rate: both parts' step size (the schedule).
      beta: Muon's momentum.
      ns_steps: Newton-Schulz iterations.
      nesterov: Nesterov momentum.
      weight_decay: decoupled weight decay of the Muon matrices (times the learning rate).
      consistent_rms: scale each matrix's update to this RMS (0.2: about AdamW's, Liu et al.,
        2025), so that one learning rate serves both parts; None for Muon's width scaling.
      adam_b1, adam_b2: AdamW's betas for the other parameters.
      adam_weight_decay: AdamW's weight decay for the other parameters (optax applies it to all
        of them: biases and LayerNorm too, so it defaults to 0).
      eps: both parts' epsilon.
      mask: which Muon matrices are decayed (`optim.masks`).
    """
    return optax.contrib.muon(
        learning_rate,
        ns_steps=ns_steps,
        beta=beta,
        eps=eps,
        weight_decay=weight_decay,
        weight_decay_mask=mask,
        nesterov=nesterov,
        adam_b1=adam_b1,
        adam_b2=adam_b2,
        adam_weight_decay=adam_weight_decay,
        muon_weight_dimension_numbers=muon_matrices,
        consistent_rms=consistent_rms,
    )
