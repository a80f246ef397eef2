"""Attention over segments (XLA, and jax.nn's API) and its dropout masks, against an independent
per-sequence reference and the statistics of independent Bernoulli draws."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.kernels import segment_attention


def test_xla_matches_reference(qkv_segments, per_sequence_attention):
    out = jax.jit(segment_attention.xla_attention)(*qkv_segments)
    np.testing.assert_allclose(out, per_sequence_attention(*qkv_segments), atol=1e-5)


def test_xla_with_a_logit_bias_matches_reference(qkv_segments, per_sequence_attention):
    batch, length, heads, _ = qkv_segments[0].shape
    bias = np.random.default_rng(1).standard_normal((batch, heads, length, length))
    bias = bias.astype(np.float32)
    out = jax.jit(lambda *a: segment_attention.xla_attention(*a, bias=bias))(*qkv_segments)
    np.testing.assert_allclose(out, per_sequence_attention(*qkv_segments, bias=bias), atol=1e-5)
    assert not np.allclose(out, per_sequence_attention(*qkv_segments), atol=1e-3)


def test_xla_with_a_window_matches_reference(qkv_segments, per_sequence_attention):
    """A window of 16: 8 tokens either side, the rest masked as a bias of -1e10 would."""
    batch, length, heads, _ = qkv_segments[0].shape
    position = np.arange(length)
    far = np.abs(position[:, None] - position[None, :]) > 8
    bias = np.broadcast_to(np.where(far, -1e10, 0.0), (batch, heads, length, length))
    out = jax.jit(lambda *a: segment_attention.xla_attention(*a, window=16))(*qkv_segments)
    np.testing.assert_allclose(out, per_sequence_attention(*qkv_segments, bias=bias), atol=1e-5)
    assert not np.allclose(out, per_sequence_attention(*qkv_segments), atol=1e-3)


def test_jax_nn_attention_matches(qkv_segments, per_sequence_attention):
    # implementation="xla" of jax.nn.dot_product_attention: the cuDNN path's API on CPU.
    fn = jax.jit(lambda *a: segment_attention.jax_nn_attention(*a, implementation="xla"))
    np.testing.assert_allclose(fn(*qkv_segments), per_sequence_attention(*qkv_segments), atol=1e-5)


def test_dropout_stays_within_sequences(qkv_segments):
    q, k, v, segments = qkv_segments

    def run(v):
        return segment_attention.xla_attention(
            q, k, v, segments, dropout_rate=0.5, dropout_rng=jax.random.key(0), deterministic=False
        )

    run = jax.jit(run)
    base = run(v)
    assert not np.allclose(base, segment_attention.xla_attention(q, k, v, segments), atol=1e-3)
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
    keep, keep_rate = segment_attention.dropout_keep_mask(rng, 0.9, shape, groups, bits)
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
    keep, keep_rate = segment_attention.dropout_keep_mask(rng, 0.9, shape, 0, bits=8)
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
    out = segment_attention.xla_attention(
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
