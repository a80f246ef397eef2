"""block_sparse_matmul, with each implementation, against a float64 dense matmul with the masked
weight (`matmul_against_dense`); 'auto''s choice, its errors, and the kernels under a mesh. Each
kernel's own tests: tests/bert_flax/kernels/test_block_sparse_*.py.
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.block_sparse import (
    BlockSparseLayout,
    block_sparse_matmul,
    masked_dense_weight,
    random_layout,
    resolve_impl,
)
from bert_flax.block_sparse import matmul as matmul_impl
from bert_flax.kernels import block_sparse_cpu


@pytest.mark.parametrize("impl", ["xla", "cpu"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("density", [0.15, 0.5])
def test_matches_dense_masked_matmul(impl, block_size, density, matmul_against_dense):
    layout = random_layout(256, 192, block_size, density, seed=block_size)
    matmul_against_dense(layout, impl=impl)


@pytest.mark.parametrize("impl", ["xla", "cpu"])
def test_uneven_and_empty_columns(impl, matmul_against_dense):
    mask = np.zeros((6, 5), bool)
    mask[:, 0] = True  # a full column next to single blocks: per-chunk padding
    mask[2, 1] = mask[4, 3] = mask[0, 4] = True  # column 2 and input rows 1, 3, 5 stay empty
    layout = BlockSparseLayout.from_mask(mask, 8, allow_empty=True)
    y, _, _ = matmul_against_dense(layout, rows=(4,), impl=impl)
    np.testing.assert_array_equal(y[:, 16:24], 0.0)


def test_auto_picks_the_cpu_kernel_for_float32_only():
    assert block_sparse_cpu.build_error() is None  # a C++ compiler is part of the test environment
    assert resolve_impl("auto", 32, jnp.float32) == "cpu"
    assert resolve_impl("auto", 32, jnp.bfloat16) == "xla"
    assert resolve_impl("auto", 4, jnp.float32) == "xla"  # not a block size the kernel has


def test_auto_without_a_compiler_logs_the_xla_fallback_once(monkeypatch, caplog):
    error = "No C++ compiler found: cannot run 'c++' ($CXX)"
    monkeypatch.setattr(block_sparse_cpu, "build_error", lambda: error)
    matmul_impl._log_impl.cache_clear()
    with caplog.at_level(logging.INFO):
        assert [resolve_impl("auto", 32) for _ in range(3)] == ["xla"] * 3
    (record,) = [r for r in caplog.records if "Block-sparse" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "Block-sparse layers use the XLA path: about 5x slower than the CPU kernel, which is "
        f"unavailable: {error}"
    )


def test_dense_reference_helper_and_dtypes():
    layout = random_layout(64, 32, 16, 0.5, seed=2)
    rng = np.random.default_rng(0)
    blocks = jnp.asarray(rng.standard_normal(layout.blocks_shape), jnp.float32)
    np.testing.assert_array_equal(masked_dense_weight(blocks, layout), layout.to_dense(blocks))
    x = jnp.ones((2, 64), jnp.bfloat16)
    y = block_sparse_matmul(x, blocks.astype(jnp.bfloat16), layout)
    assert y.dtype == jnp.bfloat16 and y.shape == (2, 32)
    dblocks = jax.grad(lambda b: block_sparse_matmul(x, b, layout).sum().astype(float))(blocks)
    assert dblocks.dtype == jnp.float32  # mixed precision: float32 master blocks


def test_errors():
    layout = random_layout(64, 32, 16, 0.5)
    blocks = jnp.zeros(layout.blocks_shape)
    with pytest.raises(ValueError, match="in_features=64"):
        block_sparse_matmul(jnp.ones((2, 48)), blocks, layout)
    with pytest.raises(ValueError, match="blocks have shape"):
        block_sparse_matmul(jnp.ones((2, 64)), blocks[1:], layout)
    with pytest.raises(ValueError, match="Unknown block-sparse impl"):
        block_sparse_matmul(jnp.ones((2, 64)), blocks, layout, impl="cuda")


SHARDED_GRADIENTS = """
import jax, jax.numpy as jnp, numpy as np
from bert_flax import sharding
from bert_flax.block_sparse import block_sparse_matmul, random_layout

layout = random_layout(256, 384, {block}, 0.5, seed=0)
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((8, 5, 256)), jnp.float32)
blocks = jnp.asarray(rng.standard_normal(layout.blocks_shape), jnp.float32)
def loss(x, b, impl):
    return (block_sparse_matmul(x, b, layout, impl=impl) ** 2).sum()
expected = jax.grad(loss, argnums=(0, 1))(x, blocks, "xla")
mesh = sharding.create_mesh((4, 1, 1))
rules = sharding.rules_for_mesh(mesh)
step = sharding.jit_partitioned(jax.grad(lambda x, b: loss(x, b, "{impl}"), argnums=(0, 1)),
                                mesh, rules)
got = step(jax.device_put(x, sharding.batch_sharding(mesh)), blocks)
for e, g in zip(expected, got):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-3)
print("OK")
"""


@pytest.mark.slow(seconds=25)
@pytest.mark.parametrize("impl", ["pallas_tpu_interpret", "pallas_interpret", "cpu"])
def test_kernels_on_a_data_mesh_match_one_device(run_on_devices, impl):
    """Pallas: per batch shard in shard_map, each shard's weight gradient summed over the shards.
    The C++ kernel: left to XLA's partitioner (no shard_map)."""
    block = {"cpu": "32"}.get(impl, "128")
    code = SHARDED_GRADIENTS.replace("{impl}", impl).replace("{block}", block)
    run_on_devices(code, devices=4)
