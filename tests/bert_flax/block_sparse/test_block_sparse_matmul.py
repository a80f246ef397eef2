"""block_sparse_matmul against a float64 dense matmul with the masked weight.

Tolerance: float32 inputs with <= 256-term dot products; we require |err| <= 1e-4 * (1 + |ref|)
(observed errors are ~1e-6 relative).
"""

import logging
import subprocess
import sys

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
from bert_flax.block_sparse import cpu as cpu_impl
from bert_flax.block_sparse import matmul as matmul_impl
from bert_flax.block_sparse import xla as xla_impl

TOL = dict(rtol=1e-4, atol=1e-4)


def _reference(x, blocks, g, layout):
    """(y, dx, dblocks) from float64 numpy with the dense masked weight."""
    w = layout.to_dense(np.asarray(blocks, np.float64))
    x2 = np.asarray(x, np.float64).reshape(-1, layout.in_features)
    g2 = np.asarray(g, np.float64).reshape(-1, layout.out_features)
    y = (x2 @ w).reshape(g.shape)
    dx = (g2 @ w.T).reshape(x.shape)
    return y, dx, layout.from_dense(x2.T @ g2)


def _check(layout, rows=(3, 7), impl="xla", seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((*rows, layout.in_features)), jnp.float32)
    blocks = jnp.asarray(rng.standard_normal(layout.blocks_shape), jnp.float32)
    g = jnp.asarray(rng.standard_normal((*rows, layout.out_features)), jnp.float32)
    fn = jax.jit(lambda x, b: block_sparse_matmul(x, b, layout, impl=impl))
    y, vjp = jax.vjp(fn, x, blocks)
    dx, dblocks = vjp(g)
    y_ref, dx_ref, db_ref = _reference(x, blocks, g, layout)
    assert dblocks.shape == layout.blocks_shape  # zero blocks are neither stored nor graded
    np.testing.assert_allclose(y, y_ref, **TOL)
    np.testing.assert_allclose(dx, dx_ref, **TOL)
    np.testing.assert_allclose(dblocks, db_ref, **TOL)
    return y, dx, dblocks


@pytest.mark.parametrize("impl", ["xla", "cpu"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("density", [0.15, 0.5])
def test_matches_dense_masked_matmul(impl, block_size, density):
    layout = random_layout(256, 192, block_size, density, seed=block_size)
    _check(layout, impl=impl)


# Rows: fewer than one register tile, whole tiles only, whole tiles and a remainder.
@pytest.mark.parametrize("rows", [(1,), (16,), (4, 9)])
@pytest.mark.parametrize("block_size", [8, 64])
def test_cpu_kernel_tiles_and_block_sizes(rows, block_size):
    _check(random_layout(256, 192, block_size, 0.5, seed=3), rows=rows, impl="cpu")


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 40])  # one column per chunk / one chunk
def test_chunking_does_not_change_results(monkeypatch, chunk_bytes):
    monkeypatch.setattr(xla_impl, "CHUNK_BYTES", chunk_bytes)
    _check(random_layout(128, 256, 16, 0.3, seed=1))


@pytest.mark.parametrize("impl", ["xla", "cpu"])
def test_uneven_and_empty_columns(impl):
    mask = np.zeros((6, 5), bool)
    mask[:, 0] = True  # a full column next to single blocks: per-chunk padding
    mask[2, 1] = mask[4, 3] = mask[0, 4] = True  # column 2 and input rows 1, 3, 5 stay empty
    layout = BlockSparseLayout.from_mask(mask, 8, allow_empty=True)
    y, _, _ = _check(layout, rows=(4,), impl=impl)
    np.testing.assert_array_equal(y[:, 16:24], 0.0)


def test_auto_picks_the_cpu_kernel_for_float32_only():
    assert cpu_impl.build_error() is None  # a C++ compiler is part of the test environment
    assert resolve_impl("auto", 32, jnp.float32) == "cpu"
    assert resolve_impl("auto", 32, jnp.bfloat16) == "xla"
    assert resolve_impl("auto", 4, jnp.float32) == "xla"  # not a block size the kernel has


def test_cpu_kernel_under_vmap():
    layout = random_layout(64, 32, 8, 0.5, seed=4)
    rng = np.random.default_rng(0)
    blocks = jnp.asarray(rng.standard_normal(layout.blocks_shape), jnp.float32)
    x = jnp.asarray(rng.standard_normal((3, 5, 64)), jnp.float32)
    mapped = jax.vmap(lambda xi: block_sparse_matmul(xi, blocks, layout, impl="cpu"))(x)
    np.testing.assert_allclose(mapped, block_sparse_matmul(x, blocks, layout, impl="xla"), **TOL)


def test_cpu_kernel_errors(monkeypatch, tmp_path):
    layout = random_layout(64, 32, 16, 0.5)
    blocks = jnp.zeros(layout.blocks_shape, jnp.bfloat16)
    with pytest.raises(ValueError, match="float32, not bfloat16; use impl='xla'"):
        block_sparse_matmul(jnp.ones((2, 64), jnp.bfloat16), blocks, layout, impl="cpu")
    small = random_layout(64, 32, 4, 0.5)
    with pytest.raises(ValueError, match=r"block sizes \(8, 16, 32, 64\), not 4"):
        block_sparse_matmul(jnp.ones((2, 64)), jnp.zeros(small.blocks_shape), small, impl="cpu")
    cache = tmp_path / "cache"
    monkeypatch.setenv("BERT_FLAX_KERNEL_CACHE", str(cache))
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler"))
    with pytest.raises(RuntimeError, match="No C\\+\\+ compiler found: cannot run"):
        cpu_impl.build()
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path / "c++", "__AVX2__"))
    with pytest.raises(RuntimeError, match="Compiling the block-sparse CPU kernel failed"):
        cpu_impl.build()
    assert list(cache.iterdir()) == []  # nothing half-written left behind


def _fake_compiler(path, macro: str) -> str:
    """A "compiler" whose target under -march=native defines `macro`, and that compiles nothing."""
    probe = f'*-march=native*"-dM -E"*) echo "#define {macro} 1";;'
    path.write_text(f'#!/bin/sh\ncase "$*" in {probe} *) exit 1;; esac\n')
    path.chmod(0o755)
    return str(path)


def test_the_cache_key_names_the_cpu_it_was_built_for(tmp_path):
    """A cache shared by machines of different CPUs never hands one's library to another (an
    AVX-512 build to an AVX2 host: SIGILL)."""
    compiler = tmp_path / "c++"
    path_for = lambda macro: cpu_impl._library_path(_fake_compiler(compiler, macro))
    assert path_for("__AVX512F__") == path_for("__AVX512F__")
    assert path_for("__AVX512F__") != path_for("__AVX2__")


def test_the_command_prints_the_library_it_built():
    command = [sys.executable, "-m", "bert_flax.block_sparse.cpu"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == cpu_impl.build()


def test_auto_without_a_compiler_logs_the_xla_fallback_once(monkeypatch, caplog):
    error = "No C++ compiler found: cannot run 'c++' ($CXX)"
    monkeypatch.setattr(cpu_impl, "build_error", lambda: error)
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


@pytest.mark.parametrize("block_size", [8, 16])
def test_pallas_interpret_matches_xla(block_size):
    layout = random_layout(64, 96, block_size, 0.4, seed=block_size)
    xla_out = _check(layout, rows=(5,), impl="xla")
    pallas_out = _check(layout, rows=(5,), impl="pallas_interpret")
    for a, b in zip(xla_out, pallas_out):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_tpu_kernels_interpreted_match_dense():
    """The Mosaic kernels (blocks of 128): columns of 1 and 3 blocks, rows that are not a tile."""
    layout = random_layout(512, 384, 128, 0.4, seed=4)
    assert len(set(layout.mask.sum(axis=0))) > 1  # columns of different counts
    _check(layout, rows=(3, 13), impl="pallas_tpu_interpret")


def test_tpu_kernels_reject_other_block_sizes():
    layout = random_layout(256, 256, 32, 0.5)
    with pytest.raises(ValueError, match="blocks of 128"):
        block_sparse_matmul(jnp.ones((8, 256)), jnp.ones(layout.blocks_shape), layout,
                            impl="pallas_tpu_interpret")  # fmt: skip


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


CONCURRENT_KERNELS = """
import os
if hasattr(os, "sched_setaffinity"):  # XLA's thread pool as small as on 2 cores, on any machine
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from bert_flax.block_sparse import block_sparse_matmul, random_layout

layouts = [random_layout(256, 256, bs, 0.5, seed=bs) for bs in (8, 16, 32, 64)]
rng = np.random.default_rng(0)
x, g = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
blocks = [rng.standard_normal(layout.blocks_shape).astype(np.float32) for layout in layouts]
mesh = jax.make_mesh((4,), ("d",))

def per_device(x, g, blocks):  # four layers' products, each weight gradient summed over devices
    out = []
    for layout, b in zip(layouts, blocks):
        y, vjp = jax.vjp(lambda x, b: block_sparse_matmul(x, b, layout, impl="cpu"), x, b)
        dx, db = vjp(g)
        out.append((y, dx, jax.lax.psum(db, "d")))
    return out

specs = (P("d"), P("d"), P())
step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=[specs] * 4,
                             check_vma=False))
args = (*jax.device_put((x, g), NamedSharding(mesh, P("d"))), blocks)
for _ in range(3):
    got = step(*args)
x64, g64 = x.astype(np.float64), g.astype(np.float64)
for layout, b, outs in zip(layouts, blocks, got):
    w = layout.to_dense(b.astype(np.float64))
    for out, ref in zip(outs, (x64 @ w, g64 @ w.T, layout.from_dense(x64.T @ g64))):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
print("OK")
"""


def test_cpu_kernels_on_four_devices_at_once_finish_and_match_dense(run_on_devices):
    """Four devices' kernels and weight-gradient all-reduces run at once on XLA's thread pool.
    Before every thread claimed slices, a kernel waited on slices it had queued there while the
    pool's threads waited in an all-reduce for that kernel's device: this hung."""
    run_on_devices(CONCURRENT_KERNELS, devices=4, timeout=120)
