"""Attention backends against an independent per-sequence reference."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.model import attention
from bert_flax.model.config import BertConfig
from bert_flax.model.layers import RelativePositionBias, relative_position_bucket

B, L, H, D = 2, 128, 2, 16


@pytest.fixture(scope="module")
def qkv_segments():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, L, H, D)).astype(np.float32) for _ in range(3))
    segments = np.zeros((B, L), np.int32)
    segments[0, :50], segments[0, 50:51], segments[0, 51:100] = 1, 2, 3  # a one-token sequence
    segments[1, :128] = 1  # a full row, no padding
    return q, k, v, segments


def reference(q, k, v, segments, bias=None):
    """Softmax attention run separately on each sequence's own tokens (numpy, float64)."""
    out = np.zeros(q.shape, np.float64)
    for b in range(q.shape[0]):
        for s in set(segments[b].tolist()) - {0}:
            idx = np.flatnonzero(segments[b] == s)
            logits = np.einsum("qhd,khd->hqk", q[b, idx], k[b, idx]) / np.sqrt(q.shape[-1])
            if bias is not None:
                logits = logits + bias[b][:, idx][:, :, idx]
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[b, idx] = np.einsum("hqk,khd->qhd", probs, v[b, idx])
    return out


def test_xla_matches_reference(qkv_segments):
    out = jax.jit(attention.xla_attention)(*qkv_segments)
    np.testing.assert_allclose(out, reference(*qkv_segments), atol=1e-5)


def test_xla_with_a_logit_bias_matches_reference(qkv_segments):
    bias = np.random.default_rng(1).standard_normal((B, H, L, L)).astype(np.float32)
    out = jax.jit(lambda *a: attention.xla_attention(*a, bias=bias))(*qkv_segments)
    np.testing.assert_allclose(out, reference(*qkv_segments, bias=bias), atol=1e-5)
    assert not np.allclose(out, reference(*qkv_segments), atol=1e-3)


def test_xla_with_a_window_matches_reference(qkv_segments):
    """A window of 16: 8 tokens either side, the rest masked as a bias of -1e10 would."""
    position = np.arange(L)
    far = np.abs(position[:, None] - position[None, :]) > 8
    bias = np.broadcast_to(np.where(far, -1e10, 0.0), (B, H, L, L))
    out = jax.jit(lambda *a: attention.xla_attention(*a, window=16))(*qkv_segments)
    np.testing.assert_allclose(out, reference(*qkv_segments, bias=bias), atol=1e-5)
    assert not np.allclose(out, reference(*qkv_segments), atol=1e-3)


@pytest.mark.parametrize("impl", ["packed_tpu", "packed_gpu"])
def test_the_skipping_backends_take_a_window_and_the_others_refuse_it(impl, qkv_segments):
    out = attention.attention(*qkv_segments, impl=impl, window=16)
    np.testing.assert_allclose(out, attention.xla_attention(*qkv_segments, window=16), atol=2e-5)
    with pytest.raises(ValueError, match=r"attention_impl='splash' has no sliding window"):
        attention.attention(*qkv_segments, impl="splash", window=16)


def _bucket_reference(offset: int, num_buckets: int, max_distance: int) -> int:
    """T5's relative bucket, one offset at a time, written from its description."""
    half = num_buckets // 2
    exact = half // 2
    first = half if offset > 0 else 0
    n = abs(offset)
    if n < exact:
        return first + n
    log_bucket = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact))
    return first + min(log_bucket, half - 1)


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 16), (4, 3)])
def test_relative_position_buckets_match_a_scalar_reference(num_buckets, max_distance):
    offsets = np.arange(-300, 301)
    got = np.asarray(relative_position_bucket(jnp.asarray(offsets), num_buckets, max_distance))
    want = [_bucket_reference(int(o), num_buckets, max_distance) for o in offsets]
    np.testing.assert_array_equal(got, want)
    # Every bucket is used but the second half's first (a positive offset of 0), as in T5.
    assert set(got.tolist()) == set(range(num_buckets)) - {num_buckets // 2}


def test_neighbour_bias_starts_heads_0_and_1_on_the_previous_and_next_token():
    config = BertConfig.preset(
        "tiny", num_heads=4, relative_attention_buckets=8, relative_attention_neighbour_bias=5.0
    )
    module = RelativePositionBias(config)
    bias = np.asarray(module.apply(module.init(jax.random.key(0), 7), 7))[0]
    rows = np.arange(7)
    offset = rows[None, :] - rows[:, None]  # [query, key]
    np.testing.assert_array_equal(bias[0], np.where(offset == -1, 5.0, 0.0))
    np.testing.assert_array_equal(bias[1], np.where(offset == 1, 5.0, 0.0))
    np.testing.assert_array_equal(bias[2:], 0.0)


def test_relative_attention_is_validated():
    BertConfig.preset("tiny", relative_attention_buckets=32)
    for bad in ({"relative_attention_buckets": 7}, {"relative_attention_buckets": 2}):
        with pytest.raises(ValueError, match="even number >= 4"):
            BertConfig.preset("tiny", **bad)
    with pytest.raises(ValueError, match="takes no logit bias"):
        BertConfig.preset(
            "tiny", relative_attention_buckets=32, attention_impl="cudnn", attention_dropout_rate=0
        )
    with pytest.raises(ValueError, match="needs relative_attention_buckets"):
        BertConfig.preset("tiny", relative_attention_neighbour_bias=5.0)
    with pytest.raises(ValueError, match="num_heads >= 2"):
        BertConfig.preset(
            "tiny", num_heads=1, relative_attention_buckets=8, relative_attention_neighbour_bias=5
        )


def test_jax_nn_attention_matches(qkv_segments):
    # implementation="xla" of jax.nn.dot_product_attention: the cuDNN path's API on CPU.
    fn = jax.jit(lambda *a: attention.jax_nn_attention(*a, implementation="xla"))
    np.testing.assert_allclose(fn(*qkv_segments), reference(*qkv_segments), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [attention.splash_attention, attention.pallas_gpu_attention])
def test_kernel_interpret_matches_xla_forward_and_backward(qkv_segments, kernel):
    q, k, v, segments = qkv_segments

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, segments)))

    fused = loss(lambda *a: kernel(*a, interpret=True))
    xla = loss(attention.xla_attention)
    out = jax.jit(lambda *a: kernel(*a, interpret=True))(*qkv_segments)
    np.testing.assert_allclose(out, reference(*qkv_segments), atol=1e-5)
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
        out = attention.splash_attention(q, k, v, segments, interpret=True)
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


def test_dropout_stays_within_sequences(qkv_segments):
    q, k, v, segments = qkv_segments

    def run(v):
        return attention.xla_attention(
            q, k, v, segments, dropout_rate=0.5, dropout_rng=jax.random.key(0), deterministic=False
        )

    run = jax.jit(run)
    base = run(v)
    assert not np.allclose(base, attention.xla_attention(q, k, v, segments), atol=1e-3)
    other = np.array(v)
    other[0, 51:100] += 1.0  # change sequence 3 of row 0 only
    changed = run(other)
    np.testing.assert_array_equal(np.asarray(changed)[0, :51], np.asarray(base)[0, :51])
    np.testing.assert_array_equal(np.asarray(changed)[0, 100:], 0.0)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
@pytest.mark.parametrize("groups", [0, 1, 3])
@pytest.mark.parametrize("bits", [32, 8])
def test_dropout_masks_keep_their_rate_and_head_groups_share_masks(impl, groups, bits):
    """Each head's mask keeps its rate (0.9, or 230/256 from bytes; within 5 standard errors);
    heads of one group share a mask; masks of different groups agree as independent ones do
    (p^2 + (1-p)^2)."""
    shape = (2, 12, 64, 64)
    rng = jax.random.key(3, impl=impl)
    keep, keep_rate = attention.dropout_keep_mask(rng, 0.9, shape, groups, bits)
    keep = np.asarray(keep)
    assert keep.shape == shape and keep_rate == (0.9 if bits == 32 else 230 / 256)
    per_head = keep.reshape(2, 12, -1).mean(-1)
    stderr = math.sqrt(keep_rate * (1 - keep_rate) / 64**2)
    np.testing.assert_allclose(per_head, keep_rate, atol=5 * stderr)
    heads = np.arange(12)
    group = heads // (12 // groups) if groups else heads
    for a in range(12):
        for b in range(a + 1, 12):
            agreement = (keep[:, a] == keep[:, b]).mean()
            if group[a] == group[b]:
                assert agreement == 1.0, (a, b)
            else:
                assert abs(agreement - (keep_rate**2 + (1 - keep_rate) ** 2)) < 0.02, (a, b)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
@pytest.mark.parametrize("length", [64, 63])
def test_byte_masks_keep_the_rounded_rate_independently(impl, length):
    """8-bit masks keep 230/256 of entries, not 0.9 (over these 1.5M entries the two are 6.5
    standard errors apart); the four entries drawn from one 32-bit word are independent of one
    another (each pair agrees as independent ones do); lengths need not be a multiple of 4."""
    shape = (32, 12, 64, length)
    rng = jax.random.key(5, impl=impl)
    keep, keep_rate = attention.dropout_keep_mask(rng, 0.9, shape, 0, bits=8)
    keep = np.asarray(keep)
    assert keep.shape == shape and keep_rate == 230 / 256
    stderr = math.sqrt(keep_rate * (1 - keep_rate) / keep.size)
    assert abs(keep.mean() - keep_rate) < 3 * stderr
    assert abs(keep.mean() - 0.9) > 3 * stderr
    by_word = keep[..., : length // 4 * 4].reshape(-1, 4)
    for a in range(4):
        for b in range(a + 1, 4):
            agreement = (by_word[:, a] == by_word[:, b]).mean()
            assert abs(agreement - (keep_rate**2 + (1 - keep_rate) ** 2)) < 0.005, (a, b)


def test_byte_masked_attention_is_unbiased():
    """With uniform attention over ones every output is 1; 8-bit dropout keeps the mean at 1
    (scaled by 256/230, its rounded keep rate: 1 / 0.9 would leave 0.9983, 9 standard errors
    off over these 3.1M mask entries)."""
    batch, length, heads = 64, 64, 12
    q = k = jnp.zeros((batch, length, heads, 1))
    v = jnp.ones((batch, length, heads, 1))
    segments = jnp.ones((batch, length), jnp.int32)
    out = attention.xla_attention(
        q,
        k,
        v,
        segments,
        dropout_rate=0.1,
        dropout_rng=jax.random.key(0),
        deterministic=False,
        dropout_bits=8,
    )
    stderr = math.sqrt((1 - 230 / 256) / (230 / 256) / (batch * heads * length**2))
    assert abs(float(out.mean()) - 1.0) < 3 * stderr


def test_attention_dropout_bits_are_checked():
    with pytest.raises(ValueError, match="attention_dropout_bits=16 is not one of"):
        BertConfig.preset("tiny", attention_dropout_bits=16)
    with pytest.raises(ValueError, match=r"dropout rate of 0\.001 keeps 256/256"):
        BertConfig.preset("tiny", attention_dropout_bits=8, attention_dropout_rate=0.001)
    with pytest.raises(ValueError, match=r"dropout rate of 0\.999 keeps 0/256"):
        BertConfig.preset("tiny", attention_dropout_bits=8, attention_dropout_rate=0.999)
    assert BertConfig.preset("tiny", attention_dropout_bits=8).attention_dropout_bits == 8


def test_attention_dropout_head_groups_must_divide_the_heads():
    with pytest.raises(ValueError, match="attention_dropout_head_groups=5 must be 0"):
        BertConfig.preset("tiny", attention_dropout_head_groups=5)
    assert BertConfig.preset("tiny", attention_dropout_head_groups=1).attention_dropout_head_groups


def test_fused_backends_reject_attention_dropout():
    for impl in ("cudnn", "splash", "pallas_gpu", "auto"):
        with pytest.raises(ValueError, match="attention_dropout_rate"):
            BertConfig.preset("tiny", attention_impl=impl)
        BertConfig.preset("tiny", attention_impl=impl, attention_dropout_rate=0.0)


@pytest.mark.parametrize("impl", ["packed_tpu", "packed_gpu"])
def test_block_skipping_kernels_take_attention_dropout_but_not_its_variants(impl):
    BertConfig.preset("tiny", attention_impl=impl)
    for variant in ({"attention_dropout_head_groups": 1}, {"attention_dropout_bits": 8}):
        with pytest.raises(ValueError, match="draws its own attention-dropout mask"):
            BertConfig.preset("tiny", attention_impl=impl, **variant)
        BertConfig.preset("tiny", attention_impl=impl, attention_dropout_rate=0, **variant)


@pytest.mark.parametrize(
    ("platform", "length", "expected"),
    [("tpu", 512, "packed_tpu"), ("gpu", 512, "packed_gpu"), ("cpu", 512, "xla"),
     ("tpu", 128, "packed_tpu"), ("gpu", 384, "packed_gpu"), ("tpu", 200, "xla"),
     ("gpu", 64, "xla")],
)  # fmt: skip
def test_auto_is_the_platforms_kernel_where_its_rows_fit(platform, length, expected):
    assert attention.backend_for("auto", platform, length) == expected


@pytest.mark.parametrize(
    ("impl", "platform"), [("splash", "gpu"), ("pallas_gpu", "tpu"), ("packed_gpu", "tpu")]
)
def test_a_kernel_for_the_other_accelerator_is_an_error_naming_the_fix(impl, platform):
    fix = "packed_tpu" if platform == "tpu" else "packed_gpu"
    with pytest.raises(ValueError, match=rf"interpret mode.*'auto' \(here '{fix}'\)"):
        attention.backend_for(impl, platform, 512)
    assert attention.backend_for(impl, platform, 512, interpret=True) == impl  # asked for
    assert attention.backend_for(impl, "cpu", 512) == impl  # the test suite's interpret mode
    assert attention.backend_for("xla", platform, 512) == "xla"


def test_a_kernel_traced_for_the_other_accelerator_fails_unless_interpreted(
    monkeypatch, qkv_segments
):
    """At trace time too (a model built outside `create_train_program`): splash in a program for
    a GPU is refused; with `interpret` it runs, interpreted, and matches the reference."""
    monkeypatch.setattr(attention.sharding, "target_platform", lambda: "gpu")
    with pytest.raises(ValueError, match="attention_interpret=True"):
        attention.attention(*qkv_segments, impl="splash")
    out = attention.attention(*qkv_segments, impl="splash", interpret=True)
    np.testing.assert_allclose(out, reference(*qkv_segments), atol=1e-5)


def test_auto_runs_xla_attention_on_cpu(monkeypatch, qkv_segments):
    calls = []
    xla = attention.BACKENDS["xla"]
    traced = dataclasses.replace(xla, fn=lambda *a, **k: calls.append(k) or xla.fn(*a, **k))
    monkeypatch.setitem(attention.BACKENDS, "xla", traced)
    out = attention.attention(*qkv_segments, impl="auto", interpret=True)
    np.testing.assert_allclose(out, reference(*qkv_segments), atol=1e-5)
    assert len(calls) == 1 and "interpret" not in calls[0]  # XLA takes no interpret flag


def test_attention_interpret_is_for_pallas_kernels():
    with pytest.raises(ValueError, match="attention_interpret=True interprets Pallas kernels"):
        BertConfig.preset("tiny", attention_interpret=True)
    for impl in ("splash", "pallas_gpu", "packed_gpu", "auto"):
        BertConfig.preset(
            "tiny", attention_impl=impl, attention_interpret=True, attention_dropout_rate=0.0
        )


def test_a_backend_added_to_the_registry_is_accepted_and_used(monkeypatch, qkv_segments):
    """Adding a backend touches `attention.BACKENDS` only: the config accepts its name and the
    layer dispatches to it."""
    calls = []

    def traced_xla(*args, **kwargs):
        calls.append(kwargs)
        return attention.xla_attention(*args, **kwargs)

    with pytest.raises(ValueError, match="attention_impl='reference' is not one of"):
        BertConfig.preset("tiny", attention_impl="reference")
    backend = attention.Backend(traced_xla, supports_dropout=False, description="test")
    monkeypatch.setitem(attention.BACKENDS, "reference", backend)
    with pytest.raises(
        ValueError, match=r"use attention_impl in \['xla', 'packed_gpu', 'packed_tpu'\]"
    ):
        BertConfig.preset("tiny", attention_impl="reference")
    BertConfig.preset("tiny", attention_impl="reference", attention_dropout_rate=0.0)
    out = attention.attention(*qkv_segments, impl="reference")
    np.testing.assert_allclose(out, reference(*qkv_segments), atol=1e-5)
    assert len(calls) == 1 and calls[0]["deterministic"]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["packed_tpu_attention", "packed_gpu_attention"])
def test_skipping_kernels_dropout_under_a_mesh_draws_the_unsharded_masks(run_on_devices, kernel):
    """Each shard's rows and heads get their own seeds: sharded over rows and heads, the dropped
    output is the one-device output (a kernel hashing local row and head indices would repeat
    shard 0's masks on every shard)."""
    run_on_devices("tests.bert_flax.model.sharded_kernel_worker", 4, "dropout", kernel)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kernel", ["splash_attention", "packed_tpu_attention", "packed_gpu_attention"]
)
def test_a_kernel_under_a_mesh_runs_per_shard(run_on_devices, kernel):
    run_on_devices("tests.bert_flax.model.sharded_kernel_worker", 4, "forward", kernel)
