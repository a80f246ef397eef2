"""Pluggable optimizers: a registry over optax, LAMB with BERT's recipe, Muon, Shampoo and SOAP.

import optim
tx = optim.create("lamb", learning_rate=1e-3)          # or optim.create(config.optimizer)
opt_state = tx.init(params)
...                                                       # jitted: tx.update(grads, ...)
opt_state = optim.after_step(tx, opt_state, step)         # host work (Shampoo, SOAP: async)
"""

from optim.first_order import adamw, adjust_betas_for_packing, lamb, sgd
from optim.host import HostTransformation, after_step, host_metrics
from optim.layerwise import layerwise
from optim.masks import weight_decay_mask
from optim.muon import muon
from optim.registry import (
    OPTIMIZERS,
    config_section,
    create,
    hyperparameters,
    register,
    settings_of,
)
from optim.shampoo import shampoo
from optim.shampoo_core import ShampooState, TensorState
from optim.soap import soap
from optim.soap_core import SoapState, SoapTensorState

__all__ = [
    "OPTIMIZERS",
    "HostTransformation",
    "ShampooState",
    "SoapState",
    "SoapTensorState",
    "TensorState",
    "adamw",
    "adjust_betas_for_packing",
    "after_step",
    "config_section",
    "create",
    "host_metrics",
    "hyperparameters",
    "lamb",
    "layerwise",
    "muon",
    "register",
    "settings_of",
    "sgd",
    "shampoo",
    "soap",
    "weight_decay_mask",
]
