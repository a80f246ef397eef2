"""The Pallas attention kernels as the model calls them, interpreted on CPU, against the
per-sequence reference and `xla_attention`; under a mesh, one kernel per shard."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.kernels import pallas_attention, segment_attention


@pytest.mark.slow
@pytest.mark.parametrize(
    "kernel", [pallas_attention.splash_attention, pallas_attention.pallas_gpu_attention]
)
def test_kernel_interpret_matches_xla_forward_and_backward(
    qkv_segments, kernel, per_sequence_attention
):
    q, k, v, segments = qkv_segments

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, segments)))

    fused = loss(lambda *a: kernel(*a, interpret=True))
    xla = loss(segment_attention.xla_attention)
    out = jax.jit(lambda *a: kernel(*a, interpret=True))(*qkv_segments)
    np.testing.assert_allclose(out, per_sequence_attention(*qkv_segments), atol=1e-5)
    grads_fused = jax.jit(jax.grad(fused, argnums=(0, 1, 2)))(q, k, v)
    grads_xla = jax.jit(jax.grad(xla, argnums=(0, 1, 2)))(q, k, v)
    for name, g_f, g_x in zip("qkv", grads_fused, grads_xla):
        np.testing.assert_allclose(g_f, g_x, atol=1e-5, err_msg=f"d{name}")


def test_splash_kernels_compute_in_the_inputs_dtype(qkv_segments):
    """bfloat16 q, k, v reach the kernels as bfloat16 (a float32 scale on q once made the
    forward and backward kernels float32: slower products, twice the bytes)."""
    q, k, v, segments = (x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x
                         for x in qkv_segments)  # fmt: skip

    def loss(q, k, v):
        out = pallas_attention.splash_attention(q, k, v, segments, interpret=True)
        return jnp.sum(out.astype(jnp.float32))

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    kernels = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
    assert len(kernels) == 3  # forward, dK/dV, dQ
    rows, length, heads, head_dim = q.shape
    for kernel in kernels:  # q, k, v (and dO) in the kernels' [rows, heads, length, head_dim]
        operands = [
            v.aval for v in kernel.invars if v.aval.shape == (rows, heads, length, head_dim)
        ]
        assert len(operands) >= 3 and {str(a.dtype) for a in operands} == {"bfloat16"}


def _equations(jaxpr):
    for equation in jaxpr.eqns:
        yield equation
        for param in equation.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from _equations(inner)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["packed_tpu_attention", "packed_gpu_attention"])
def test_skipping_kernels_dropout_under_a_mesh_draws_the_unsharded_masks(run_on_devices, kernel):
    """Each shard's rows and heads get their own seeds: sharded over rows and heads, the dropped
    output is the one-device output (a kernel hashing local row and head indices would repeat
    shard 0's masks on every shard)."""
    run_on_devices("tests.bert_flax.kernels.sharded_kernel_worker", 4, "dropout", kernel)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kernel", ["splash_attention", "packed_tpu_attention", "packed_gpu_attention"]
)
def test_a_kernel_under_a_mesh_runs_per_shard(run_on_devices, kernel):
    run_on_devices("tests.bert_flax.kernels.sharded_kernel_worker", 4, "forward", kernel)
