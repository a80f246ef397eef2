"""Block-sparse weights: layouts, a matmul whose cost scales with the nonzero blocks, layers."""

from bert_flax.block_sparse.bert import BlockSparseConfig
from bert_flax.block_sparse.layout import (
    LAYOUT_KINDS,
    BlockSparseLayout,
    barabasi_albert_graph,
    dense_layout,
    make_layout,
    random_layout,
    small_world_layout,
    watts_strogatz_graph,
)
from bert_flax.block_sparse.matmul import (
    IMPLS,
    block_sparse_matmul,
    masked_dense_weight,
    resolve_impl,
)
from bert_flax.block_sparse.module import BlockSparseDense

__all__ = [
    "IMPLS",
    "LAYOUT_KINDS",
    "BlockSparseConfig",
    "BlockSparseDense",
    "BlockSparseLayout",
    "barabasi_albert_graph",
    "block_sparse_matmul",
    "dense_layout",
    "make_layout",
    "masked_dense_weight",
    "random_layout",
    "resolve_impl",
    "small_world_layout",
    "watts_strogatz_graph",
]
