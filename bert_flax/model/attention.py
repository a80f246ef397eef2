"""Multi-head attention kernels restricted to tokens of the same packed sequence.

Every backend applies the same rule: query i may attend to key j iff
`segment_ids[i] == segment_ids[j]`. Real tokens (ids 1..k) therefore see only their own sequence;
padding (id 0) sees only padding, so no softmax row is ever empty (no NaN), and the outputs at
padding positions are zeroed afterwards. Backends with `supports_window` also take a sliding
`window` (`bert_flax.kernels.block_ranges`): query i then sees key j only within
`|i - j| <= window // 2` as well.

Shapes: q, k, v are [batch, length, heads, head_dim]; segment_ids is [batch, length]; an
optional additive `bias` on the logits broadcasts to [batch, heads, length, length] (the
relative-position bias of `bert_flax.model.layers.RelativePositionBias`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import attention as pallas_gpu
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from bert_flax import sharding
from bert_flax.kernels import block_ranges, dropout_bits, packed_attention_gpu, packed_attention_tpu

Array = jax.Array

# Finite, so masked logits never produce inf - inf in the softmax.
_MASK_VALUE = -1e10


def segment_mask(segment_ids: Array) -> Array:
    """Boolean [batch, 1, q_len, kv_len] mask: True where both tokens share a segment id."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


def _zero_padding(out: Array, segment_ids: Array) -> Array:
    return jnp.where((segment_ids != 0)[:, :, None, None], out, jnp.zeros((), out.dtype))


def xla_attention(
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    bias: Array | None = None,
    dropout_head_groups: int = 0,
    dropout_bits: int = 32,
    window: int | None = None,
) -> Array:
    """Dense-mask attention as two einsums; logits and softmax in float32. Works everywhere.
    `window` (None: global) masks the keys farther than `window // 2` tokens from the query.

    `dropout_head_groups` g > 0 draws g attention-dropout masks per row, each shared by
    heads/g consecutive heads (0: one per head, as BERT), cutting the random bits g/heads-fold.
    `dropout_bits` 8 draws each mask entry from one byte instead of a 32-bit word
    (`dropout_keep_mask`).
    """
    block_ranges.check_window(window)
    scale = q.shape[-1] ** -0.5
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    if bias is not None:
        logits = logits + bias
    mask = segment_mask(segment_ids)
    if window is not None:
        position = jnp.arange(q.shape[1], dtype=jnp.int32)
        mask &= block_ranges.within_window(position[:, None], position[None, :], window)
    logits = jnp.where(mask, logits, _MASK_VALUE)
    probs = jax.nn.softmax(logits, axis=-1)
    if not deterministic and dropout_rate > 0.0:
        if dropout_rng is None:
            raise ValueError("Attention dropout needs a dropout_rng when deterministic=False.")
        keep, keep_rate = dropout_keep_mask(
            dropout_rng, 1.0 - dropout_rate, probs.shape, dropout_head_groups, dropout_bits
        )
        probs = jnp.where(keep, probs / keep_rate, 0.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
    return _zero_padding(out, segment_ids)


def byte_keep_threshold(keep_rate: float) -> int:
    """The keep rate as a count of byte values: an entry is kept where its random byte is below
    it, so 8-bit masks keep `threshold / 256` (0.9 becomes 230 / 256 = 0.8984)."""
    threshold = round(keep_rate * 256)
    if not 0 < threshold < 256:
        raise ValueError(
            f"A dropout rate of {1 - keep_rate:g} keeps {threshold}/256 with 8-bit masks, which "
            "they cannot draw (they can draw rates strictly between 1/512 and 1 - 1/512); use "
            "32-bit masks (attention_dropout_bits=32)."
        )
    return threshold


def _keep_mask_and_rate(
    rng: Array, keep_rate: float, shape: tuple, bits: int
) -> tuple[Array, float]:
    """A keep mask of `shape` and the rate it keeps; 8 bits: four entries per 32-bit word, each
    from one of its bytes (as FlashAttention's dropout does), so a quarter of the draws."""
    if bits == 32:
        return jax.random.bernoulli(rng, keep_rate, shape), keep_rate
    threshold = byte_keep_threshold(keep_rate)
    *lead, last = shape
    words = jax.random.bits(rng, (*lead, -(-last // 4)), jnp.uint32)
    random_bytes = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(*lead, -1)[..., :last]
    return random_bytes < threshold, threshold / 256


def dropout_keep_mask(
    rng: Array, keep_rate: float, shape: tuple, head_groups: int, bits: int = 32
) -> tuple[Array, float]:
    """A Bernoulli keep mask of `shape` [batch, heads, q, k] and its exact keep rate (the scale
    that keeps the output unbiased). With `head_groups` g > 0 only [batch, g, q, k] draws, each
    broadcast over its group of heads/g heads; `bits` 32 draws one 32-bit word per entry
    (`jax.random.bernoulli`), 8 one byte, the keep rate rounded to a multiple of 1/256."""
    if not head_groups:
        return _keep_mask_and_rate(rng, keep_rate, shape, bits)
    batch, heads, *rest = shape
    keep, keep_rate = _keep_mask_and_rate(rng, keep_rate, (batch, head_groups, 1, *rest), bits)
    keep = jnp.broadcast_to(keep, (batch, head_groups, heads // head_groups, *rest))
    return keep.reshape(shape), keep_rate


@functools.cache
def _log_once(message: str) -> None:
    logging.info(message)


def jax_nn_attention(
    q: Array, k: Array, v: Array, segment_ids: Array, *, implementation: str | None = None
) -> Array:
    """`jax.nn.dot_product_attention` with the segment mask.

    `implementation=None` picks "cudnn" on GPU (which needs bfloat16/float16 inputs) and the
    reference "xla" implementation of the same API elsewhere.
    """
    if implementation is None:
        platform = sharding.target_platform()
        implementation = "cudnn" if platform == "gpu" else "xla"
        if implementation == "xla":
            _log_once(f"attention_impl='cudnn' on {platform}: using its XLA version.")
    out = jax.nn.dot_product_attention(
        q, k, v, mask=segment_mask(segment_ids), implementation=implementation
    )
    return _zero_padding(out, segment_ids)


def splash_attention(
    q: Array, k: Array, v: Array, segment_ids: Array, *, interpret: bool = False
) -> Array:
    """Pallas splash attention (TPU) with segment ids; `interpret=True` runs it on any backend.

    `length` must be a multiple of 128 (the TPU lane width); the largest of 512/256/128 dividing
    it is the block size. Under a mesh (`jax.set_mesh`) with flax logical-axis rules, the kernel
    runs per shard in `jax.shard_map`, batch and heads split as the rules say.
    """
    _check_kernel_length("splash", q.shape[1])
    local = functools.partial(_splash_local, interpret=interpret)
    return _per_shard(local, "splash", q, k, v, segment_ids)


def pallas_gpu_attention(
    q: Array, k: Array, v: Array, segment_ids: Array, *, interpret: bool = False
) -> Array:
    """Pallas flash attention for GPU (`jax.experimental.pallas.ops.gpu.attention`, Triton) with
    segment ids; `interpret=True` runs it on any backend. It takes q, k, v as the model holds
    them ([rows, length, heads, head_dim]: no transposes); `length` a multiple of 128. Under a
    mesh it runs per shard, as `splash_attention` does."""
    _check_kernel_length("pallas_gpu", q.shape[1])

    def local(q, k, v, segment_ids):
        out = pallas_gpu.mha(q, k, v, segment_ids, sm_scale=q.shape[-1] ** -0.5,
                             interpret=interpret)  # fmt: skip
        return _zero_padding(out.astype(v.dtype), segment_ids)

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
    _check_kernel_length("packed_gpu", q.shape[1])
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
    _check_kernel_length("packed_tpu", q.shape[1])
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


# `attention_impl="auto"`: the kernel for each platform the program targets, the one that skips the
# blocks a packed row's sequences never share; XLA on any other.
AUTO = "auto"
PLATFORM_KERNELS = {"tpu": "packed_tpu", "gpu": "packed_gpu"}


def backend_for(impl: str, platform: str, length: int, interpret: bool = False) -> str:
    """The backend that `impl` runs on `platform` with rows of `length`: "auto" the platform's
    kernel (`PLATFORM_KERNELS`) where `length` is a multiple of 128, else "xla" (logged once);
    any other `impl` itself, if it can run there (`_check_platform`)."""
    if impl != AUTO:
        _check_platform(impl, platform, interpret)
        return impl
    impl = PLATFORM_KERNELS.get(platform, "xla")
    if BACKENDS[impl].platform and length % 128:
        _log_once(f"attention_impl='auto': rows of {length} are not a multiple of 128; 'xla'.")
        return "xla"
    _log_once(f"attention_impl='auto' on {platform}: {impl!r}.")
    return impl


def _check_platform(impl: str, platform: str, interpret: bool) -> None:
    """ValueError, naming the fix, where Pallas kernel `impl` would run in interpret mode on
    another accelerator than its own without `interpret` asking for it (on CPU, kernels are
    always interpreted)."""
    own = BACKENDS[impl].platform
    if own and platform not in (own, "cpu") and not interpret:
        raise ValueError(
            f"attention_impl={impl!r} is a {own.upper()} kernel: on {platform.upper()} it would "
            f"run in Pallas interpret mode, orders of magnitude slower; use attention_impl='auto' "
            f"(here {PLATFORM_KERNELS.get(platform, 'xla')!r}), or set attention_interpret=True "
            "to debug."
        )


def _check_kernel_length(impl: str, length: int) -> None:
    if length % 128:
        raise ValueError(
            f"attention_impl={impl!r} needs the row length to be a multiple of 128, got "
            f"{length}; set config.data.max_seq_length to one or use attention_impl='xla'."
        )


def check_backend(impl: str, num_heads: int, length: int, mesh_shape: dict[str, int]) -> None:
    """Fails at configuration time, naming the fix, where back-end `impl` cannot run rows of
    `length` with `num_heads` heads on a mesh of `mesh_shape` (rather than in a `shard_map`
    trace at the first step)."""
    if not BACKENDS[impl].platform:
        return
    _check_kernel_length(impl, length)
    model = mesh_shape.get("model", 1)
    if num_heads % model:
        raise ValueError(
            f"attention_impl={impl!r} runs per shard with the heads split over the mesh's "
            f"'model' axis: num_heads={num_heads} is not divisible by its {model} devices; "
            "choose a model axis size that divides the heads, or attention_impl='xla'."
        )


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
    return _zero_padding(out, segment_ids)


@dataclasses.dataclass(frozen=True)
class Backend:
    """An attention kernel `fn(q, k, v, segment_ids, *, dropout_rate, dropout_rng,
    deterministic, bias, dropout_head_groups, dropout_bits, window, interpret)`;
    `supports_dropout`, `supports_dropout_variants` and `supports_bias` say whether it implements
    attention dropout, its variants (`dropout_head_groups`, `dropout_bits`) and an additive logit
    bias (configs asking for one that it does not are rejected by `BertConfig`);
    `supports_window` whether it takes a sliding `window` (`attention` refuses one otherwise).
    `platform`: where a Pallas kernel compiles ("tpu", "gpu"; on CPU it is interpreted, and `fn`
    takes `interpret`); such kernels run per shard (`_per_shard`), rows tiled by 128. None for
    backends that run anywhere."""

    fn: Callable[..., Array]
    supports_dropout: bool
    description: str
    supports_bias: bool = False
    platform: str | None = None
    supports_dropout_variants: bool = False
    supports_window: bool = False


def _cudnn(q: Array, k: Array, v: Array, segment_ids: Array, **_) -> Array:
    return jax_nn_attention(q, k, v, segment_ids)


def _pallas_kernel(
    kernel: Callable[..., Array], impl: str, platform: str, packed: bool = False
) -> Callable[..., Array]:
    """A backend running `kernel` compiled where the program targets `platform`, in Pallas
    interpret mode on CPU or when asked (`interpret`; slow: for tests and debugging), and
    refusing another accelerator (`_check_platform`). With `packed` (the block-skipping
    kernels), `kernel` takes `dropout_rate`, `dropout_rng`, `deterministic` and `window`."""

    def backend(
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
        **_,
    ) -> Array:
        target = sharding.target_platform()
        _check_platform(impl, target, interpret)
        interpret = interpret or target != platform
        if interpret:
            _log_once(f"attention_impl={impl!r} on {target}: Pallas interpret mode.")
        if packed:
            options = dict(dropout_rate=dropout_rate, dropout_rng=dropout_rng,
                           deterministic=deterministic, window=window)  # fmt: skip
            return kernel(q, k, v, segment_ids, interpret=interpret, **options)
        return kernel(q, k, v, segment_ids, interpret=interpret)

    return backend


def _auto(q: Array, k: Array, v: Array, segment_ids: Array, *, interpret=False, **kwargs) -> Array:
    impl = backend_for(AUTO, sharding.target_platform(), q.shape[1])
    if interpret and BACKENDS[impl].platform:
        kwargs["interpret"] = True
    return BACKENDS[impl].fn(q, k, v, segment_ids, **kwargs)


# The backends `BertConfig.attention_impl` may name; adding one here is all it takes.
BACKENDS: dict[str, Backend] = {
    "xla": Backend(
        xla_attention,
        True,
        "dense mask, two einsums; any backend",
        supports_bias=True,
        supports_dropout_variants=True,
        supports_window=True,
    ),
    "cudnn": Backend(_cudnn, False, "jax.nn.dot_product_attention; cuDNN on GPU"),
    "splash": Backend(
        _pallas_kernel(splash_attention, "splash", "tpu"),
        False,
        "Pallas splash attention; TPU (interpret mode on CPU)",
        platform="tpu",
    ),
    "pallas_gpu": Backend(
        _pallas_kernel(pallas_gpu_attention, "pallas_gpu", "gpu"),
        False,
        "Pallas flash attention over segments (Triton); GPU (interpret mode on CPU)",
        platform="gpu",
    ),
    "packed_gpu": Backend(
        _pallas_kernel(packed_gpu_attention, "packed_gpu", "gpu", packed=True),
        True,
        "Pallas flash attention visiting only the blocks a row's sequences share, counter-based "
        "attention dropout (Triton); GPU (interpret mode on CPU)",
        platform="gpu",
        supports_window=True,
    ),
    "packed_tpu": Backend(
        _pallas_kernel(packed_tpu_attention, "packed_tpu", "tpu", packed=True),
        True,
        "Pallas flash attention skipping the blocks sequences never share, counter-based "
        "attention dropout; TPU (interpret mode on CPU)",
        platform="tpu",
        supports_window=True,
    ),
    AUTO: Backend(
        _auto,
        False,
        "the platform's kernel (`PLATFORM_KERNELS`): packed_tpu on TPU, packed_gpu on GPU, "
        "else xla",
    ),
}


def attention(
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array,
    *,
    impl: str = "xla",
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    bias: Array | None = None,
    dropout_head_groups: int = 0,
    dropout_bits: int = 32,
    window: int | None = None,
    interpret: bool = False,
) -> Array:
    """Dispatches to the backend named by `BertConfig.attention_impl` (a key of `BACKENDS`);
    `interpret` runs a Pallas kernel in interpret mode (`BertConfig.attention_interpret`);
    `window` (None: global) a sliding window, on the backends that support one."""
    if impl not in BACKENDS:
        raise ValueError(f"Unknown attention impl {impl!r}; use one of {sorted(BACKENDS)}.")
    if window is not None and not BACKENDS[impl].supports_window:
        supported = sorted(name for name, b in BACKENDS.items() if b.supports_window)
        raise ValueError(
            f"attention_impl={impl!r} has no sliding window; use one of {supported} or window=None."
        )
    # Only pass `bias`, the dropout variants, `window` and `interpret` when set: backends without
    # them need not accept them.
    extra = {} if bias is None else {"bias": bias}
    if window is not None:
        extra["window"] = window
    if dropout_head_groups:
        extra["dropout_head_groups"] = dropout_head_groups
    if dropout_bits != 32:
        extra["dropout_bits"] = dropout_bits
    if interpret:
        extra["interpret"] = True
    return BACKENDS[impl].fn(
        q,
        k,
        v,
        segment_ids,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
        deterministic=deterministic,
        **extra,
    )
