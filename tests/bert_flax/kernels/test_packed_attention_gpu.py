"""The block-skipping GPU attention kernel, interpreted on CPU, against `xla_attention` (dense
mask), with and without a sliding window; the blocks it skips are never read."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.kernels import dropout_bits, segment_attention
from bert_flax.kernels.packed_attention_gpu import Blocks, packed_attention
from bert_flax.model import attention
from tests.bert_flax.kernels.test_packed_attention_tpu import dropped_reference, windowed_reference

L, H, D = 256, 2, 64


def packed_row(lengths: list[int]) -> np.ndarray:
    """Segment ids of one row: sequences 1..k of `lengths` in order, padding (0) after."""
    row = np.zeros(L, np.int32)
    row[: sum(lengths)] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
    return row


def random_lengths(rng: np.random.Generator, fill: int) -> list[int]:
    lengths = []
    while sum(lengths) < fill:
        lengths.append(int(rng.integers(1, 100)))
    lengths[-1] -= sum(lengths) - fill
    return lengths


# Each a row: random packings (one with padding, one full), no sequence at all, one sequence
# filling the row, many tiny sequences (1 to 4 tokens, crossing every block boundary).
ROWS = {
    "random": random_lengths(np.random.default_rng(0), 200),
    "random full": random_lengths(np.random.default_rng(1), L),
    "empty": [],
    "one sequence": [L],
    "tiny": [1, 2, 3, 4] * 25,
}


def inputs(dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    segments = np.stack([packed_row(lengths) for lengths in ROWS.values()])
    q, k, v, d_out = (
        jnp.asarray(rng.standard_normal((len(ROWS), L, H, D)), dtype) for _ in range(4)
    )
    return q, k, v, jnp.asarray(segments), d_out


def value_and_grads(fn, q, k, v, segments, d_out):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, segments), q, k, v)
    return (out, *vjp(d_out))


def kernel(blocks: Blocks, window=None):
    return jax.jit(lambda q, k, v, s: packed_attention(q, k, v, s, blocks=blocks, window=window,
                                                       interpret=True))  # fmt: skip


@pytest.mark.parametrize(
    "blocks", [Blocks(), Blocks(q=64, k=128, q_bwd=128, k_bwd=64)], ids=["default", "swapped"]
)
def test_outputs_and_gradients_match_xla_attention(blocks):
    q, k, v, segments, d_out = inputs()
    got = value_and_grads(kernel(blocks), q, k, v, segments, d_out)
    want = value_and_grads(jax.jit(segment_attention.xla_attention), q, k, v, segments, d_out)
    for name, g, w in zip(["out", "dq", "dk", "dv"], got, want, strict=True):
        for row, case in enumerate(ROWS):
            np.testing.assert_allclose(g[row], w[row], atol=2e-5, err_msg=f"{name}, {case}")


def test_bfloat16_inputs_stay_close_to_float32_attention():
    """Within 0.03 of float32 attention of the same (rounded) inputs, values of scale 4
    (measured 0.013, as far as XLA's bfloat16 attention is)."""
    q, k, v, segments, d_out = inputs(jnp.bfloat16, seed=1)
    got = value_and_grads(kernel(Blocks(64, 64, 64, 64)), q, k, v, segments, d_out)
    as_float32 = [x.astype(jnp.float32) for x in (q, k, v, d_out)]
    want = value_and_grads(jax.jit(segment_attention.xla_attention), *as_float32[:3], segments,
                           as_float32[3])  # fmt: skip
    for g, w in zip(got, want, strict=True):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(g.astype(np.float32), w, atol=0.03)


def test_a_head_dim_not_a_power_of_two_is_padded():
    """Triton tiles are powers of two: head_dim 48 loads and stores as 64, masked."""
    q, k, v, segments, d_out = (x[:2, ..., :48] if x.ndim == 4 else x[:2] for x in inputs())
    got = value_and_grads(kernel(Blocks()), q, k, v, segments, d_out)
    want = value_and_grads(jax.jit(segment_attention.xla_attention), q, k, v, segments, d_out)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=2e-5)


def test_no_block_outside_the_range_is_read():
    """The second sequence's q, k, v and output gradient are NaN: a kernel that read one of its
    blocks for the first sequence (masked, but 0 * NaN is NaN) would spread them there."""
    q, k, v, _, d_out = inputs()
    segments = jnp.asarray(np.stack([packed_row([128, 128])] * 2))
    want = value_and_grads(jax.jit(segment_attention.xla_attention), q[:2], k[:2], v[:2], segments,
                           d_out[:2])  # fmt: skip
    second = (segments == 2)[:, :, None, None]
    poisoned = [jnp.where(second, jnp.nan, x[:2]) for x in (q, k, v, d_out)]
    got = value_and_grads(kernel(Blocks(64, 64, 64, 64)), *poisoned[:3], segments, poisoned[3])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g[:, :128], w[:, :128], atol=2e-5)


# Windows smaller than a block, across blocks, longer than the row (global attention).
@pytest.mark.parametrize(
    ("window", "blocks"),
    [(16, Blocks()), (96, Blocks(q=64, k=128, q_bwd=128, k_bwd=64)), (1024, Blocks())],
)
def test_a_sliding_window_matches_the_dense_reference(window, blocks):
    q, k, v, segments, d_out = inputs()
    got = value_and_grads(kernel(blocks, window), q, k, v, segments, d_out)
    reference = windowed_reference(segments, window)
    want = value_and_grads(jax.jit(reference), q, k, v, segments, d_out)
    for name, g, w in zip(["out", "dq", "dk", "dv"], got, want, strict=True):
        for row, case in enumerate(ROWS):
            np.testing.assert_allclose(g[row], w[row], atol=2e-5, err_msg=f"{name}, {case}")


def test_no_block_beyond_the_window_is_read():
    """One sequence filling the row of four 64-token blocks, a window of 32: NaN in the last
    block's q, k, v and output gradient reach nothing of the first block, which sees two blocks
    (a kernel visiting all of the sequence's blocks, masking by the window inside them, spreads
    them there: 0 * NaN)."""
    q, k, v, _, d_out = (x[:1] for x in inputs())
    segments = jnp.ones((1, L), jnp.int32)
    last = (jnp.arange(L) >= 192)[None, :, None, None]
    zeroed = [jnp.where(last, 0.0, x) for x in (q, k, v)]
    want = value_and_grads(jax.jit(windowed_reference(segments, 32)), *zeroed, segments, d_out)
    poisoned = [jnp.where(last, jnp.nan, x) for x in (q, k, v, d_out)]
    got = value_and_grads(kernel(Blocks(64, 64, 64, 64), 32), *poisoned[:3], segments, poisoned[3])
    for name, g, w in zip(["out", "dq", "dk", "dv"], got, want, strict=True):
        np.testing.assert_allclose(g[:, :64], w[:, :64], atol=2e-5, err_msg=name)


def test_the_backend_runs_interpreted_on_cpu_and_checks_the_length():
    q, k, v, segments, _ = inputs()
    out = attention.attention(q, k, v, segments, impl="packed_gpu")
    np.testing.assert_allclose(out, segment_attention.xla_attention(q, k, v, segments), atol=2e-5)
    with pytest.raises(ValueError, match="multiple of the kernel block 128"):
        packed_attention(q[:, :160], k[:, :160], v[:, :160], segments[:, :160], blocks=Blocks())


@pytest.mark.parametrize(
    "blocks", [Blocks(), Blocks(q=64, k=128, q_bwd=128, k_bwd=64)], ids=["default", "swapped"]
)
def test_dropout_matches_the_dense_reference_with_its_mask(blocks):
    """Outputs and gradients with attention dropout against dense attention applying the same
    `dropout_bits.keep_mask`: the backward kernels recompute the forward's mask."""
    q, k, v, segments, d_out = inputs()
    rate = 0.3
    seeds = dropout_bits.row_head_seeds(jax.random.key(3), q.shape[0], H)
    fn = jax.jit(lambda q, k, v, s: packed_attention(q, k, v, s, blocks=blocks, dropout_rate=rate,
                                                     seeds=seeds, interpret=True))  # fmt: skip
    got = value_and_grads(fn, q, k, v, segments, d_out)
    want = value_and_grads(jax.jit(dropped_reference(rate, seeds)), q, k, v, segments, d_out)
    assert (
        np.abs(np.asarray(got[0] - segment_attention.xla_attention(q, k, v, segments))).max() > 0.1
    )
    for name, g, w in zip(["out", "dq", "dk", "dv"], got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-5, err_msg=name)
