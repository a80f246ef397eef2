"""The XLA block-sparse products: however its columns are chunked, the float64 dense matmul."""

import pytest

from bert_flax.block_sparse import random_layout
from bert_flax.kernels import block_sparse_xla


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 40])  # one column per chunk / one chunk
def test_chunking_does_not_change_results(monkeypatch, chunk_bytes, matmul_against_dense):
    monkeypatch.setattr(block_sparse_xla, "CHUNK_BYTES", chunk_bytes)
    matmul_against_dense(random_layout(128, 256, 16, 0.3, seed=1))
