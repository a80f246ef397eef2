"""Run by test_pallas_attention.py on 4 simulated CPU devices: `python -m
tests.bert_flax.kernels.sharded_kernel_worker forward|dropout KERNEL` runs the attention kernel
`KERNEL` (interpreted) on a 2 x 1 x 2 (data, fsdp, model) mesh; "forward" checks its output and
gradient against XLA attention, "dropout" its dropped output against the one-device output;
prints OK."""

import sys

import flax.linen as nn
import jax
import numpy as np

from bert_flax import sharding
from bert_flax.kernels import pallas_attention, segment_attention

MESH = (2, 1, 2)


def qkv() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 128, 4, 16)).astype(np.float32) for _ in range(3))
    return q, k, v


def forward(kernel_name: str) -> None:
    q, k, v = qkv()
    seg = np.zeros((4, 128), np.int32)
    seg[:, :60], seg[:, 60:100] = 1, 2
    seg[1, 10:] = 0

    def kernel(q):
        return getattr(pallas_attention, kernel_name)(q, k, v, seg, interpret=True)

    def xla(q):
        return segment_attention.xla_attention(q, k, v, seg)

    with jax.set_mesh(sharding.create_mesh(MESH)):
        with nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
            out = jax.jit(kernel)(q)
            grad = jax.jit(jax.grad(lambda q: (kernel(q) ** 2).sum()))(q)
    assert out.sharding.spec == jax.sharding.PartitionSpec("data", None, "model"), out.sharding
    np.testing.assert_allclose(out, xla(q), atol=1e-5)
    np.testing.assert_allclose(grad, jax.grad(lambda q: (xla(q) ** 2).sum())(q), atol=1e-5)


def dropout(kernel_name: str) -> None:
    q, k, v = qkv()
    seg = np.ones((4, 128), np.int32)

    def kernel(q):
        return getattr(pallas_attention, kernel_name)(
            q, k, v, seg, dropout_rate=0.5, dropout_rng=jax.random.key(0), deterministic=False,
            interpret=True,
        )  # fmt: skip

    with jax.set_mesh(sharding.create_mesh(MESH)):
        with nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
            sharded = jax.jit(kernel)(q)
    np.testing.assert_allclose(sharded, jax.jit(kernel)(q), atol=1e-5)


if __name__ == "__main__":
    {"forward": forward, "dropout": dropout}[sys.argv[1]](sys.argv[2])
    print("OK")
