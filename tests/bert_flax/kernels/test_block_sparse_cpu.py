"""The C++ CPU kernel: tiles, block sizes and vmap against a float64 dense matmul (through
`block_sparse_matmul`), its build's errors and cache key, its command, four devices at once."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.block_sparse import block_sparse_matmul, random_layout
from bert_flax.kernels import block_sparse_cpu

TOL = dict(rtol=1e-4, atol=1e-4)


# Rows: fewer than one register tile, whole tiles only, whole tiles and a remainder.
@pytest.mark.parametrize("rows", [(1,), (16,), (4, 9)])
@pytest.mark.parametrize("block_size", [8, 64])
def test_cpu_kernel_tiles_and_block_sizes(rows, block_size, matmul_against_dense):
    matmul_against_dense(random_layout(256, 192, block_size, 0.5, seed=3), rows=rows, impl="cpu")


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
        block_sparse_cpu.build()
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path / "c++", "__AVX2__"))
    with pytest.raises(RuntimeError, match="Compiling the block-sparse CPU kernel failed"):
        block_sparse_cpu.build()
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
    path_for = lambda macro: block_sparse_cpu._library_path(_fake_compiler(compiler, macro))
    assert path_for("__AVX512F__") == path_for("__AVX512F__")
    assert path_for("__AVX512F__") != path_for("__AVX2__")


def _printed(module: str) -> str:
    """What `python -m module` prints, once it exited 0."""
    command = [sys.executable, "-m", module]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_command_prints_the_library_it_built():
    assert _printed("bert_flax.kernels.block_sparse_cpu") == block_sparse_cpu.build()


def test_the_commands_old_name_runs_it():
    assert _printed("bert_flax.block_sparse.cpu") == block_sparse_cpu.build()


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
