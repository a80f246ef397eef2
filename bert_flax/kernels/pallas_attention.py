"""The Pallas attention kernels as the model calls them: q, k, v as it holds them
([batch, length, heads, head_dim], no transposes), rows a multiple of 128, `interpret=True` to
run them on any backend, and under a mesh (`jax.set_mesh`) with flax logical-axis rules one
kernel per device's shard in `jax.shard_map`, rows and heads split as the rules say.

Splash attention (TPU) and flash attention (GPU, Triton) come from `jax.experimental.pallas.ops`;
the block-skipping kernels from `packed_attention_tpu` and `packed_attention_gpu`. Each masks
attention to the tokens of one packed sequence, as `segment_attention.xla_attention` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import attention as pallas_gpu
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from bert_flax.kernels import dropout_bits, packed_attention_gpu, packed_attention_tpu
from bert_flax.kernels.segment_attention import zero_padding

Array = jax.Array


def check_kernel_length(impl: str, length: int) -> None:
    """ValueError, naming the fix, unless rows of `length` tile by 128 for back end `impl`."""
    if length % 128:
        raise ValueError(
            f"attention_impl={impl!r} needs the row length to be a multiple of 128, got "
            f"{length}; set config.data.max_seq_length to one or use attention_impl='xla'."
        )


def splash_attention(
    q: Array, k: Array, v: Array, segment_ids: Array, *, interpret: bool = False
) -> Array:
    """Pallas splash attention (TPU) with segment ids; `interpret=True` runs it on any backend.

    `length` must be a multiple of 128 (the TPU lane width); the largest of 512/256/128 dividing
    it is the block size. Under a mesh (`jax.set_mesh`) with flax logical-axis rules, the kernel
    runs per shard in `jax.shard_map`, batch and heads split as the rules say.
    """
    check_kernel_length("splash", q.shape[1])
    local = functools.partial(_splash_local, interpret=interpret)
    return _per_shard(local, "splash", q, k, v, segment_ids)


def pallas_gpu_attention(
    q: Array, k: Array, v: Array, segment_ids: Array, *, interpret: bool = False
) -> Array:
    """Pallas flash attention for GPU (`jax.experimental.pallas.ops.gpu.attention`, Triton) with
    segment ids; `interpret=True` runs it on any backend. It takes q, k, v as the model holds
    them ([rows, length, heads, head_dim]: no transposes); `length` a multiple of 128. Under a
    mesh it runs per shard, as `splash_attention` does."""
    check_kernel_length("pallas_gpu", q.shape[1])

    def local(q, k, v, segment_ids):
        out = pallas_gpu.mha(q, k, v, segment_ids, sm_scale=q.shape[-1] ** -0.5,
                             interpret=interpret)  # fmt: skip
        return zero_padding(out.astype(v.dtype), segment_ids)

    return _per_shard(local, "pallas_gpu", q, k, v, segment_ids)


def packed_gpu_attention(
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    window: int | None = None,
    interpret: bool = False,
) -> Array:
    """`bert_flax.kernels.packed_attention_gpu`: Pallas flash attention for GPU (Triton) that
    visits only the key/value blocks each query block's sequences reach, so a packed row costs
    about the sum of its sequences' squared lengths; `interpret=True` runs it on any backend.
    Same layout, length rule and sharding as `pallas_gpu_attention`; dropout and `window` as
    `packed_tpu_attention`'s."""
    check_kernel_length("packed_gpu", q.shape[1])
    return _packed(packed_attention_gpu.packed_attention, "packed_gpu", q, k, v, segment_ids,
                   dropout_rate, dropout_rng, deterministic, window, interpret)  # fmt: skip


def packed_tpu_attention(
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    window: int | None = None,
    interpret: bool = False,
) -> Array:
    """Pallas flash attention for TPU that skips the key/value blocks no query of a block can
    see (`bert_flax.kernels.packed_attention_tpu`), in 128-token blocks; it takes q, k, v as
    the model holds them; `length` a multiple of 128. Under a mesh it runs per shard, as
    `splash_attention` does. Attention dropout draws one seed per row and head from
    `dropout_rng` and the kernels a counter-based mask from it (`kernels.dropout_bits`): a
    Bernoulli mask of the same rate (to 2^-24), not the one `xla_attention` draws from the key.
    A sliding `window` (None: global) also skips the blocks farther than `window // 2`."""
    check_kernel_length("packed_tpu", q.shape[1])
    return _packed(packed_attention_tpu.packed_attention, "packed_tpu", q, k, v, segment_ids,
                   dropout_rate, dropout_rng, deterministic, window, interpret)  # fmt: skip


def _packed(kernel, impl, q, k, v, segment_ids, dropout_rate, dropout_rng, deterministic,
            window, interpret) -> Array:  # fmt: skip
    """A block-skipping `kernel` per shard, with dropout seeds per row and head drawn from
    `dropout_rng` unless deterministic or at rate 0 (then the kernel has no dropout code), and
    the sliding `window`."""
    seeds = None
    if not deterministic and dropout_rate > 0.0:
        if dropout_rng is None:
            raise ValueError("Attention dropout needs a dropout_rng when deterministic=False.")
        seeds = dropout_bits.row_head_seeds(dropout_rng, q.shape[0], q.shape[2])
    rate = dropout_rate if seeds is not None else 0.0
    local = functools.partial(kernel, window=window, dropout_rate=rate, interpret=interpret)
    return _per_shard(local, impl, q, k, v, segment_ids, seeds)


def _per_shard(
    local: Callable[..., Array], impl: str, q, k, v, segment_ids, seeds: Array | None = None
) -> Array:
    """`local` (a kernel that cannot be partitioned) on each device's shard under the current
    mesh's logical-axis rules: rows and heads split, length and head_dim whole. `seeds`
    ([batch, heads], split as rows and heads) go to `local` as its `seeds` where given."""
    if seeds is not None:
        local = _with_seeds(local)
    args = (q, k, v, segment_ids) if seeds is None else (q, k, v, segment_ids, seeds)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return local(*args)
    qkv_spec = nn.logical_to_mesh_axes(
        ("activation_batch", "activation_length", "activation_heads", "activation_kv")
    )
    if qkv_spec[1] is not None or qkv_spec[3] is not None:
        raise ValueError(
            f"attention_impl={impl!r} cannot split the length or head_dim: {qkv_spec}."
        )
    segment_spec = jax.sharding.PartitionSpec(qkv_spec[0], None)
    seed_spec = jax.sharding.PartitionSpec(qkv_spec[0], qkv_spec[2])
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(qkv_spec, qkv_spec, qkv_spec, segment_spec, seed_spec)[: len(args)],
        out_specs=qkv_spec,
        check_vma=False,
    )(*args)


def _with_seeds(local: Callable[..., Array]) -> Callable[..., Array]:
    return lambda q, k, v, segment_ids, seeds: local(q, k, v, segment_ids, seeds=seeds)


def _splash_local(q: Array, k: Array, v: Array, segment_ids: Array, *, interpret: bool) -> Array:
    """Splash attention on one device's shard: a kernel for one row, vmapped over rows."""
    _, length, num_heads, head_dim = q.shape
    block = next(b for b in (512, 256, 128) if length % b == 0)
    block_sizes = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    mask = splash.MultiHeadMask([splash.FullMask((length, length))] * num_heads)
    kernel = splash.make_splash_mha(
        mask, block_sizes=block_sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )
    # In q's dtype: a float32 scale would make the kernel's products float32 (slower on the MXU,
    # twice the bytes).
    scale = jnp.asarray(head_dim**-0.5, q.dtype)

    def one_row(q_row, k_row, v_row, seg_row):  # [L, H, D] -> kernel layout [H, L, D]
        q_row, k_row, v_row = (x.transpose(1, 0, 2) for x in (q_row * scale, k_row, v_row))
        out = kernel(q_row, k_row, v_row, segment_ids=splash.SegmentIds(q=seg_row, kv=seg_row))
        return out.transpose(1, 0, 2)

    out = jax.vmap(one_row)(q, k, v, segment_ids).astype(v.dtype)
    return zero_padding(out, segment_ids)
