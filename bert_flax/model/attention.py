"""Attention back ends: the registry `BertConfig.attention_impl` names (`BACKENDS`), "auto"'s
choice of kernel for the platform, the checks made at configuration time, and the dispatcher
`attention`. The kernels themselves are in `bert_flax.kernels`: `segment_attention` (XLA, cuDNN;
the rule every back end applies) and `pallas_attention` (the Pallas kernels, per shard).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import jax

from bert_flax import sharding
from bert_flax.kernels import pallas_attention
from bert_flax.kernels.segment_attention import jax_nn_attention, xla_attention

Array = jax.Array


@functools.cache
def _log_once(message: str) -> None:
    logging.info(message)


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


def check_backend(impl: str, num_heads: int, length: int, mesh_shape: dict[str, int]) -> None:
    """Fails at configuration time, naming the fix, where back-end `impl` cannot run rows of
    `length` with `num_heads` heads on a mesh of `mesh_shape` (rather than in a `shard_map`
    trace at the first step)."""
    if not BACKENDS[impl].platform:
        return
    pallas_attention.check_kernel_length(impl, length)
    model = mesh_shape.get("model", 1)
    if num_heads % model:
        raise ValueError(
            f"attention_impl={impl!r} runs per shard with the heads split over the mesh's "
            f"'model' axis: num_heads={num_heads} is not divisible by its {model} devices; "
            "choose a model axis size that divides the heads, or attention_impl='xla'."
        )


@dataclasses.dataclass(frozen=True)
class Backend:
    """An attention kernel `fn(q, k, v, segment_ids, *, dropout_rate, dropout_rng,
    deterministic, bias, dropout_head_groups, dropout_bits, window, interpret)`;
    `supports_dropout`, `supports_dropout_variants` and `supports_bias` say whether it implements
    attention dropout, its variants (`dropout_head_groups`, `dropout_bits`) and an additive logit
    bias (configs asking for one that it does not are rejected by `BertConfig`);
    `supports_window` whether it takes a sliding `window` (`attention` refuses one otherwise).
    `platform`: where a Pallas kernel compiles ("tpu", "gpu"; on CPU it is interpreted, and `fn`
    takes `interpret`); such kernels run per shard (`bert_flax.kernels.pallas_attention`), rows
    tiled by 128. None for backends that run anywhere."""

    fn: Callable[..., Array]
    supports_dropout: bool
    description: str
    supports_bias: bool = False
    platform: str | None = None
    supports_dropout_variants: bool = False
    supports_window: bool = False


def _cudnn(q: Array, k: Array, v: Array, segment_ids: Array, **_) -> Array:
    """cuDNN on GPU (which needs bfloat16/float16 inputs), the XLA version of its API elsewhere."""
    platform = sharding.target_platform()
    if platform != "gpu":
        _log_once(f"attention_impl='cudnn' on {platform}: using its XLA version.")
    implementation = "cudnn" if platform == "gpu" else "xla"
    return jax_nn_attention(q, k, v, segment_ids, implementation=implementation)


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
        _pallas_kernel(pallas_attention.splash_attention, "splash", "tpu"),
        False,
        "Pallas splash attention; TPU (interpret mode on CPU)",
        platform="tpu",
    ),
    "pallas_gpu": Backend(
        _pallas_kernel(pallas_attention.pallas_gpu_attention, "pallas_gpu", "gpu"),
        False,
        "Pallas flash attention over segments (Triton); GPU (interpret mode on CPU)",
        platform="gpu",
    ),
    "packed_gpu": Backend(
        _pallas_kernel(pallas_attention.packed_gpu_attention, "packed_gpu", "gpu", packed=True),
        True,
        "Pallas flash attention visiting only the blocks a row's sequences share, counter-based "
        "attention dropout (Triton); GPU (interpret mode on CPU)",
        platform="gpu",
        supports_window=True,
    ),
    "packed_tpu": Backend(
        _pallas_kernel(pallas_attention.packed_tpu_attention, "packed_tpu", "tpu", packed=True),
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
