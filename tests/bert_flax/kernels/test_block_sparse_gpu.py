"""The Pallas GPU (Triton) block-sparse kernels, interpreted on CPU, against the dense matmul and
the XLA path."""

import numpy as np
import pytest

from bert_flax.block_sparse import random_layout


@pytest.mark.parametrize("block_size", [8, 16])
def test_pallas_interpret_matches_xla(block_size, matmul_against_dense):
    layout = random_layout(64, 96, block_size, 0.4, seed=block_size)
    xla_out = matmul_against_dense(layout, rows=(5,), impl="xla")
    pallas_out = matmul_against_dense(layout, rows=(5,), impl="pallas_interpret")
    for a, b in zip(xla_out, pallas_out):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
