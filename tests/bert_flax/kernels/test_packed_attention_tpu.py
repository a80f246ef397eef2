"""The TPU packed attention kernel, in Pallas interpret mode, against `xla_attention`: outputs
and gradients over random packings, an empty row, one sequence filling the row and many tiny
sequences, with and without a sliding window; the blocks it skips are never read."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.aot import program
from bert_flax.kernels import dropout_bits, packed_attention_gpu, segment_attention
from bert_flax.kernels.packed_attention_tpu import packed_attention
from bert_flax.model import attention
from configs import bert_base
from tests.bert_flax.aot.test_aot import H100, PLATFORM_KERNELS, V5E_4, devices_of, pallas_kernels
from tests.bert_flax.kernels.test_block_ranges import packed_row, random_lengths, visible_pairs

H, D = 2, 64


def segments(length: int) -> np.ndarray:
    """Rows: two random packings, an empty row, one sequence filling the row, many tiny
    sequences (lengths 1 to 4), one sequence and a row of padding after it."""
    rng = np.random.default_rng(1)
    tiny = []
    while sum(tiny) < length - 4:
        tiny.append(int(rng.integers(1, 5)))
    lengths = [random_lengths(rng, length, length // 2) for _ in range(2)]
    lengths += [[], [length], tiny, [100]]
    return np.stack([packed_row(n, length) for n in lengths])


def inputs(length: int, dtype=jnp.float32):
    segment_ids = segments(length)
    rng = np.random.default_rng(2)
    shape = (len(segment_ids), length, H, D)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(3))
    return q, k, v, jnp.asarray(segment_ids)


def outputs_and_grads(fn, q, k, v, segment_ids):
    """fn's output and the gradients of a scalar of it with respect to q, k, v."""

    def loss(q, k, v):
        return jnp.sum(jnp.sin(fn(q, k, v, segment_ids).astype(jnp.float32)))

    out = jax.jit(fn)(q, k, v, segment_ids)
    return out, jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)


def kernel(block_q=128, block_k=128, window=None):
    return lambda *a: packed_attention(*a, block_q=block_q, block_k=block_k, window=window,
                                       interpret=True)  # fmt: skip


def windowed_reference(segment_ids, window):
    """`xla_attention` over rows of `segment_ids` with the pairs outside `visible_pairs` (a
    dense mask built in numpy) masked by a logit bias."""
    bias = np.where(visible_pairs(segment_ids, window)[:, None], 0.0, -1e10)
    return lambda q, k, v, segment_ids: segment_attention.xla_attention(
        q, k, v, segment_ids, bias=bias
    )


def assert_matches_xla(q, k, v, segment_ids, fn, atol, reference=segment_attention.xla_attention):
    out, grads = outputs_and_grads(fn, q, k, v, segment_ids)
    ref, ref_grads = outputs_and_grads(reference, q, k, v, segment_ids)
    assert out.dtype == ref.dtype
    f32 = lambda x: np.asarray(x, np.float32)
    np.testing.assert_allclose(f32(out), f32(ref), atol=atol, err_msg="out")
    for name, grad, ref_grad in zip("qkv", grads, ref_grads):
        np.testing.assert_allclose(f32(grad), f32(ref_grad), atol=atol, err_msg=f"d{name}")


def test_matches_xla_forward_and_backward():
    assert_matches_xla(*inputs(256), kernel(), atol=2e-5)


@pytest.mark.parametrize(("block_q", "block_k"), [(256, 128), (128, 256)])
def test_matches_xla_with_unequal_blocks(block_q, block_k):
    assert_matches_xla(*inputs(512), kernel(block_q, block_k), atol=2e-5)


def test_bfloat16_matches_xla_within_its_rounding():
    assert_matches_xla(*inputs(256, jnp.bfloat16), kernel(), atol=3e-2)


def test_blocks_outside_the_ranges_are_never_computed():
    """NaN in q, k, v wherever a whole block is padding: no range holds such a block, so the
    kernel's outputs and gradients stay those of zeros there (a kernel computing every block,
    as a dense one, turns them NaN: 0 * NaN)."""
    q, k, v, segment_ids = inputs(512)
    padding_blocks = np.asarray(segment_ids).reshape(len(segment_ids), -1, 128).max(-1) == 0
    unread = jnp.asarray(np.repeat(padding_blocks, 128, axis=1))[:, :, None, None]
    assert unread.any() and not unread.all()
    poisoned = [jnp.where(unread, jnp.nan, x) for x in (q, k, v)]
    zeroed = [jnp.where(unread, 0.0, x) for x in (q, k, v)]
    out, grads = outputs_and_grads(kernel(), *poisoned, segment_ids)
    ref, ref_grads = outputs_and_grads(segment_attention.xla_attention, *zeroed, segment_ids)
    np.testing.assert_allclose(out, ref, atol=2e-5)
    for name, grad, ref_grad in zip("qkv", grads, ref_grads):
        np.testing.assert_allclose(grad, ref_grad, atol=2e-5, err_msg=f"d{name}")


# Windows smaller than a block, across blocks, longer than the row (global attention).
@pytest.mark.parametrize("window", [16, 160, 1024])
def test_a_sliding_window_matches_the_dense_reference(window):
    q, k, v, segment_ids = inputs(384)
    assert_matches_xla(q, k, v, segment_ids, kernel(window=window), atol=2e-5,
                       reference=windowed_reference(segment_ids, window))  # fmt: skip


def test_blocks_beyond_the_window_are_never_read():
    """One sequence filling the row of four blocks, a window of 64: NaN in the last block's
    q, k, v and output gradient reach nothing of the first block, which sees two blocks (a kernel
    visiting all blocks of the sequence's range, masking by the window inside them, spreads them
    there: 0 * NaN)."""
    q, k, v, _ = (x[:1] for x in inputs(512))
    segment_ids = jnp.ones((1, 512), jnp.int32)
    last = (jnp.arange(512) >= 384)[None, :, None, None]

    def first_block(fn, fill):
        q_, k_, v_, d_out = (jnp.where(last, fill, x) for x in (q, k, v, jnp.ones_like(q)))
        _, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, segment_ids), q_, k_, v_)
        return [x[:, :128] for x in (fn(q_, k_, v_, segment_ids), *vjp(d_out))]

    got = first_block(kernel(window=64), jnp.nan)
    want = first_block(windowed_reference(segment_ids, 64), 0.0)
    for name, g, w in zip(["out", "dq", "dk", "dv"], got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("fn", [packed_attention, packed_attention_gpu.packed_attention])
def test_a_window_the_kernel_cannot_take_names_the_fix_before_tracing(fn):
    x = jax.ShapeDtypeStruct((1, 256, H, D), jnp.float32)  # abstract: fails before any tracing
    with pytest.raises(ValueError, match=r"window must be a positive even .* got window=63"):
        fn(x, x, x, x, window=63)


@pytest.mark.parametrize(
    ("length", "block_q", "block_k", "message"),
    [
        (256, 96, 128, "block_q=96 does not divide the row length 256"),
        (384, 128, 256, "block_k=256 does not divide the row length 384"),
        (512, 64, 128, "multiples of 128 .* got block_q=64"),
    ],
)
def test_block_sizes_it_cannot_take_name_the_fix(length, block_q, block_k, message):
    x = jnp.zeros((1, length, H, D))
    with pytest.raises(ValueError, match=message):
        packed_attention(x, x, x, jnp.ones((1, length), jnp.int32), block_q=block_q,
                         block_k=block_k, interpret=True)  # fmt: skip


def test_rows_too_long_for_vmem_name_the_fix():
    """A row's keys and values stay in VMEM (double-buffered): 65,536 float32 tokens of
    head_dim 128 are refused when traced; half as many in bfloat16 fit."""
    x = jax.ShapeDtypeStruct((1, 65536, 1, 128), jnp.float32)
    segment_ids = jax.ShapeDtypeStruct((1, 65536), jnp.int32)
    with pytest.raises(ValueError, match=r"need 148 MiB, more than 64 MiB; use shorter rows"):
        jax.eval_shape(packed_attention, x, x, x, segment_ids)
    x = jax.ShapeDtypeStruct((1, 32768, 1, 128), jnp.bfloat16)
    segment_ids = jax.ShapeDtypeStruct((1, 32768), jnp.int32)
    jax.eval_shape(packed_attention, x, x, x, segment_ids)


def test_the_backend_runs_it_in_interpret_mode_on_cpu():
    q, k, v, segment_ids = inputs(256)
    out = attention.attention(q, k, v, segment_ids, impl="packed_tpu")
    np.testing.assert_allclose(
        out, segment_attention.xla_attention(q, k, v, segment_ids), atol=2e-5
    )


@pytest.mark.slow(seconds=30)
def test_the_train_step_compiles_its_mosaic_kernels_for_v5e():
    """configs/bert_base.py at 512 with attention_impl="packed_tpu" (one layer of width 256, to
    compile fast) on compile-only v5e devices: the forward kernel in both steps, dQ and dK/dV in
    the train step, each a Mosaic custom call (interpret mode would leave none)."""
    config = bert_base.get_config("phase2")
    config.model.update(num_layers=1, hidden_size=256, num_heads=4, intermediate_size=1024)
    config.model.update(attention_impl="packed_tpu", attention_dropout_rate=0.0)
    config.data.synthetic = True
    config.train.packing_hparams, config.train.accumulation = "none", 1
    devices = list(devices_of(V5E_4))
    config.train.batch_size = config.eval.batch_size = len(devices)
    config.mesh.shape = (len(devices), 1, 1)
    steps = program.compile_steps(config, devices)
    forward, backward = {"packed_attention_fwd"}, {"packed_attention_dq", "packed_attention_dkv"}
    assert pallas_kernels(steps.train, "tpu_custom_call", forward | backward) == forward | backward
    assert pallas_kernels(steps.eval, "tpu_custom_call", forward | backward) == forward


@pytest.mark.parametrize(("head_dim", "dtype"), [(64, jnp.bfloat16), (128, jnp.float32)])
def test_rows_of_8192_compile_for_v5e(head_dim, dtype):
    """Forward and backward over rows of 8,192 tokens (4 rows, 12 heads) fit a v5e core's VMEM:
    the row's keys and values (queries and output gradients for dK/dV) held whole."""
    device = devices_of(V5E_4)[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((4, 8192, 12, head_dim), dtype, sharding=sharding)
    segment_ids = jax.ShapeDtypeStruct((4, 8192), jnp.int32, sharding=sharding)

    def loss(q, k, v, segment_ids):
        return jnp.sum(packed_attention(q, k, v, segment_ids).astype(jnp.float32))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    executable = grad.lower(x, x, x, segment_ids).compile()
    names = {"packed_attention_fwd", "packed_attention_dq", "packed_attention_dkv"}
    assert pallas_kernels(executable, "tpu_custom_call", names) == names


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize(
    ("fn", "target", "call_target"),
    [(packed_attention, V5E_4, "tpu_custom_call"),
     (packed_attention_gpu.packed_attention, H100, PLATFORM_KERNELS["cuda"][1])],
    ids=["tpu v5e", "gpu H100"],
)  # fmt: skip
def test_windowed_kernels_compile(fn, target, call_target):
    """With a sliding window (its mask: row indices compared in the kernels) forward and backward
    compile their Mosaic (v5e) and Triton (H100) kernels."""
    sharding = jax.sharding.SingleDeviceSharding(devices_of(target)[0])
    x = jax.ShapeDtypeStruct((2, 1024, 4, 64), jnp.bfloat16, sharding=sharding)
    segment_ids = jax.ShapeDtypeStruct((2, 1024), jnp.int32, sharding=sharding)

    def loss(q, k, v, segment_ids):
        return jnp.sum(fn(q, k, v, segment_ids, window=256).astype(jnp.float32))

    executable = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, segment_ids).compile()
    calls = [c for c in executable.as_text().splitlines() if f'"{call_target}"' in c]
    names = ["packed_attention_fwd", "packed_attention_dq", "packed_attention_dkv"]
    assert [any(name in c for c in calls) for name in names] == [True] * 3


def dropped_reference(rate, seeds):
    """`xla_attention`'s dense attention with `dropout_bits.keep_mask` built outside a kernel."""

    def reference(q, k, v, segment_ids):
        length = q.shape[1]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
        mask = segment_attention.segment_mask(segment_ids)
        probs = jax.nn.softmax(jnp.where(mask, logits, -1e10), axis=-1)
        index = jnp.arange(length, dtype=jnp.int32)
        keep = dropout_bits.keep_mask(seeds[:, :, None, None], index[:, None], index[None, :], rate)
        probs = jnp.where(keep, probs / dropout_bits.keep_rate(rate), 0.0)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        return jnp.where((segment_ids != 0)[:, :, None, None], out, 0.0)

    return reference


@pytest.mark.parametrize(("block_q", "block_k"), [(128, 128), (256, 128)])
def test_dropout_matches_the_dense_reference_with_its_mask(block_q, block_k):
    """Outputs and gradients with attention dropout against dense attention applying the same
    counter-based mask: the backward kernels recompute the forward's mask."""
    q, k, v, segment_ids = inputs(256)
    rate = 0.3
    seeds = dropout_bits.row_head_seeds(jax.random.key(3), q.shape[0], H)
    fn = lambda *a: packed_attention(*a, block_q=block_q, block_k=block_k, dropout_rate=rate,
                                     seeds=seeds, interpret=True)  # fmt: skip
    out, grads = outputs_and_grads(fn, q, k, v, segment_ids)
    ref, ref_grads = outputs_and_grads(dropped_reference(rate, seeds), q, k, v, segment_ids)
    undropped = segment_attention.xla_attention(q, k, v, segment_ids)
    assert np.abs(np.asarray(out - undropped)).max() > 0.1  # dropout did something
    np.testing.assert_allclose(out, ref, atol=2e-5, err_msg="out")
    for name, grad, ref_grad in zip("qkv", grads, ref_grads):
        np.testing.assert_allclose(grad, ref_grad, atol=2e-5, err_msg=f"d{name}")


@pytest.mark.parametrize("impl", ["packed_tpu", "packed_gpu"])
def test_the_backends_draw_their_dropout_from_the_rng_and_none_when_deterministic(impl):
    """attention(impl=...) with dropout matches the dense reference under the seeds
    `row_head_seeds` draws from dropout_rng; deterministic=True or rate 0 lowers to the program
    without dropout (no seeds passed, no mask computed)."""
    q, k, v, segment_ids = inputs(256)
    rng = jax.random.key(4)
    call = lambda rate, deterministic: lambda q: attention.attention(
        q, k, v, segment_ids, impl=impl, dropout_rate=rate, dropout_rng=rng,
        deterministic=deterministic,
    )  # fmt: skip
    seeds = dropout_bits.row_head_seeds(rng, q.shape[0], H)
    ref = dropped_reference(0.2, seeds)(q, k, v, segment_ids)
    np.testing.assert_allclose(call(0.2, False)(q), ref, atol=2e-5)
    lowered = lambda fn: jax.jit(fn).lower(q).as_text()
    plain = lowered(call(0.0, True))
    assert lowered(call(0.2, True)) == lowered(call(0.0, False)) == plain
    assert lowered(call(0.2, False)) != plain
