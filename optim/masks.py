"""Which parameters get weight decay.

The rule (BERT's, by parameter path): a parameter is *not* decayed when

* its own name is ``bias`` (every bias, in any module), or
* its own name is ``scale`` (flax's name for a normalisation gain), or
* any module on its path has ``norm`` in its name, case-insensitive (``LayerNorm``,
  ``layer_norm``, ``embeddings_layer_norm``, ``RMSNorm``...), which also covers HF-style
  ``gamma``/``beta``/``weight`` names inside a norm.

Everything else (kernels, embeddings) is decayed. Flax metadata boxes (``nn.Partitioned``,
``nn.LogicallyPartitioned``) are looked through: their ``value`` attribute is not a name.
"""

from __future__ import annotations

from typing import Any

import jax

_NO_DECAY_LEAF_NAMES = frozenset({"bias", "scale"})


def path_names(path: tuple[Any, ...]) -> list[str]:
    names = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            names.append(str(key.key))
        elif isinstance(key, jax.tree_util.GetAttrKey) and key.name != "value":
            names.append(key.name)
    return names


def is_decayed(names: list[str]) -> bool:
    """Whether a parameter with this path (module names, then its own name) is decayed."""
    if not names:
        return True
    if names[-1] in _NO_DECAY_LEAF_NAMES:
        return False
    return not any("norm" in name.lower() for name in names[:-1])


def weight_decay_mask(params: Any) -> Any:
    """A pytree of bools like ``params``: True where weight decay applies (see module doc)."""
    return jax.tree_util.tree_map_with_path(lambda path, _: is_decayed(path_names(path)), params)
