"""Block-sparse BERT: the `BertConfig.block_sparse` settings and the Dense-factory branch."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn

from bert_flax.block_sparse.layout import LAYOUT_KINDS
from bert_flax.block_sparse.matmul import IMPLS
from bert_flax.block_sparse.module import BlockSparseDense

# Roles (see `bert_flax.model.layers.make_dense`) that may be made block-sparse.
SPARSE_ROLES = ("query", "key", "value", "attention_output", "ffn_intermediate", "ffn_output")
FFN_ROLES = ("ffn_intermediate", "ffn_output")


@dataclasses.dataclass(frozen=True)
class BlockSparseConfig:
    """Which encoder Dense layers are block-sparse, and how.

    Attributes:
      density: fraction of nonzero blocks in each sparse kernel.
      block_size: block edge (8, 16, 32, ...); must divide the layers' feature sizes.
      layout: layout kind, one of LAYOUT_KINDS ("random", "watts_strogatz", "barabasi_albert").
      seed: layout seed; each layer mixes in its own path, so layouts are a pure function of
        this config and the model structure (saving the model config saves the layouts).
      roles: which layers: any of SPARSE_ROLES (default: the feed-forward pair).
      wide: "wide sparse": widen the feed-forward intermediate layer by 1 / density (rounded up
        to whole blocks), keeping the parameter count of the dense model.
      impl: block_sparse_matmul implementation ("auto", "cpu", "xla", "pallas").
    """

    density: float = 0.1
    block_size: int = 32
    layout: str = "random"
    seed: int = 0
    roles: tuple[str, ...] = FFN_ROLES
    wide: bool = False
    impl: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "roles", tuple(self.roles))
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"block_sparse.density must be in (0, 1]; got {self.density}.")
        if self.layout not in LAYOUT_KINDS:
            raise ValueError(f"block_sparse.layout={self.layout!r}; choose one of {LAYOUT_KINDS}.")
        if self.impl not in IMPLS:
            raise ValueError(f"block_sparse.impl={self.impl!r}; choose one of {IMPLS}.")
        unknown = set(self.roles) - set(SPARSE_ROLES)
        if unknown or not self.roles:
            raise ValueError(
                f"block_sparse.roles={self.roles!r}: pick a non-empty subset of {SPARSE_ROLES}."
            )
        if self.wide and "ffn_intermediate" not in self.roles:
            raise ValueError("block_sparse.wide=True widens the sparse FFN: include the FFN roles.")

    @classmethod
    def coerce(cls, value: BlockSparseConfig | Mapping[str, Any] | None):
        """None, a config, or its dict form (as in a saved BertConfig) -> config or None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = set(value) - known
            if unknown:
                raise ValueError(f"Unknown block_sparse fields {sorted(unknown)}; known: {known}.")
            return cls(**value)
        raise TypeError(f"block_sparse must be None, a dict or BlockSparseConfig; got {value!r}.")

    def features(self, role: str, features: int) -> int:
        """The width a layer of `role` gets (the wide variant widens the FFN intermediate)."""
        if self.wide and role == "ffn_intermediate":
            blocks = math.ceil(features / self.density / self.block_size)
            return blocks * self.block_size
        return features


def make_block_sparse_dense(
    config: Any, features: int, *, name: str, kernel_axes: tuple[str, str], role: str
) -> nn.Module | None:
    """The block-sparse layer for `role` under `config.block_sparse`, or None to stay dense.

    `config` is a `bert_flax.model.config.BertConfig`; the initialisation matches the dense layer's
    truncated normal (stddev `initializer_range`), rescaled to each output block's real fan-in.
    """
    sparse = BlockSparseConfig.coerce(config.block_sparse)
    if sparse is None or role not in sparse.roles:
        return None
    return BlockSparseDense(
        features=sparse.features(role, features),
        block_size=sparse.block_size,
        density=sparse.density,
        layout_kind=sparse.layout,
        seed=sparse.seed,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        dense_stddev=config.initializer_range,
        kernel_axes=kernel_axes,
        impl=sparse.impl,
        name=name,
    )
