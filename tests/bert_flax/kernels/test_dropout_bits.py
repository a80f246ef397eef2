"""`dropout_bits.keep_mask`: a Bernoulli mask of the asked rate whose decisions for different
seeds, queries and keys are independent."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.kernels import dropout_bits


def masks(seeds, length: int, rate: float) -> np.ndarray:
    """[len(seeds), length, length] keep masks for int32 `seeds`."""
    index = jnp.arange(length, dtype=jnp.int32)
    seeds = jnp.asarray(seeds, jnp.int32)[:, None, None]
    return np.asarray(dropout_bits.keep_mask(seeds, index[:, None], index[None, :], rate))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_keeps_its_rate_on_a_million_draws(rate):
    keep = masks(np.arange(16) * 7919, 256, rate)  # 16 * 256^2 = 1,048,576 draws
    stderr = np.sqrt(rate * (1 - rate) / keep.size)  # 0.0005 at most: well within 1%
    assert abs(keep.mean() - (1 - rate)) < 4 * stderr
    assert dropout_bits.keep_rate(rate) == pytest.approx(1 - rate, abs=2**-24)


def test_decisions_are_independent_across_seeds_queries_and_keys():
    """Two masks (other seeds, or the next query or key) agree where independent Bernoulli
    draws would: keep^2 + drop^2 of the entries, within 4 standard errors."""
    rate, length = 0.3, 512
    seeds = np.asarray(dropout_bits.row_head_seeds(jax.random.key(0), 2, 2)).reshape(-1)
    keep = masks(np.concatenate([seeds, [0, 1]]), length, rate)
    expected = (1 - rate) ** 2 + rate**2
    stderr = np.sqrt(expected * (1 - expected) / length**2)
    pairs = {
        "other (row, head) seeds": (keep[0], keep[3]),
        "seeds 0 and 1": (keep[-2], keep[-1]),
        "next query": (keep[0, :-1], keep[0, 1:]),
        "next key": (keep[0, :, :-1], keep[0, :, 1:]),
        "transposed": (keep[0], keep[0].T),
    }
    for name, (a, b) in pairs.items():
        assert abs((a == b).mean() - expected) < 4 * stderr, name


def test_row_head_seeds_differ():
    seeds = np.asarray(dropout_bits.row_head_seeds(jax.random.key(1), 8, 12))
    assert seeds.dtype == np.int32 and len(np.unique(seeds)) == seeds.size
