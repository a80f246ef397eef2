"""The Pallas TPU (Mosaic) block-sparse kernels, interpreted on CPU, against the dense matmul."""

import jax.numpy as jnp
import pytest

from bert_flax.block_sparse import block_sparse_matmul, random_layout


def test_tpu_kernels_interpreted_match_dense(matmul_against_dense):
    """The Mosaic kernels (blocks of 128): columns of 1 and 3 blocks, rows that are not a tile."""
    layout = random_layout(512, 384, 128, 0.4, seed=4)
    assert len(set(layout.mask.sum(axis=0))) > 1  # columns of different counts
    matmul_against_dense(layout, rows=(3, 13), impl="pallas_tpu_interpret")


def test_tpu_kernels_reject_other_block_sizes():
    layout = random_layout(256, 256, 32, 0.5)
    with pytest.raises(ValueError, match="blocks of 128"):
        block_sparse_matmul(jnp.ones((8, 256)), jnp.ones(layout.blocks_shape), layout,
                            impl="pallas_tpu_interpret")  # fmt: skip
