"""Pre-training losses on a hand-made example with known values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.model import losses
from bert_flax.model.bert import PreTrainingOutput
from bert_flax.model.losses import mean

pretraining_loss = jax.jit(losses.pretraining_loss, static_argnames="mlm_normalization")

LN2 = np.log(2.0)
P_A = np.log([0.5, 0.25, 0.25])  # logits with these softmax probabilities
P_B = np.log([0.25, 0.5, 0.25])
GARBAGE = np.array([1e4, -1e4, 0.0])  # padding predictions: would dominate if counted


def _example():
    """Three rows, two slots each, vocabulary of three.

    Row 0: sequence 1 = tokens 0-2 with predictions at 1 (label 0, CE ln2, right) and 2
           (label 1, CE ln4, wrong); sequence 2 = tokens 3-4 with a prediction at 4 (label 2,
           CE ln4, wrong); token 5 padding; a padding prediction.
    Row 1: sequence 1 = tokens 0-3, one prediction at 2 (label 0 under P_B: CE ln4, wrong);
           sequence 2 = tokens 4-5 without predictions.
    Row 2: all padding, both slots empty.
    """
    segment_ids = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 2, 2], [0] * 6], np.int32)
    batch = {
        "segment_ids": segment_ids,
        "masked_lm_positions": np.array([[1, 2, 4, 0], [2, 0, 0, 0], [0, 0, 0, 0]], np.int32),
        "masked_lm_ids": np.array([[0, 1, 2, 1], [0, 0, 0, 0], [1, 1, 1, 1]], np.int32),
        "masked_lm_weights": np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32),
        "cls_positions": np.array([[0, 3], [0, 4], [0, 0]], np.int32),
        "next_sentence_labels": np.array([[0, 1], [0, 0], [0, 0]], np.int32),
        "sequence_mask": np.array([[1, 1], [1, 1], [0, 0]], np.float32),
    }
    mlm_logits = np.stack(
        [
            np.stack([P_A, P_A, P_A, GARBAGE]),
            np.stack([P_B, GARBAGE, GARBAGE, GARBAGE]),
            np.stack([GARBAGE] * 4),
        ]
    )
    nsp_logits = np.log(
        [[[0.8, 0.2], [0.4, 0.6]], [[0.3, 0.7], [0.9, 0.1]], [[1e-30, 1.0], [1e-30, 1.0]]]
    )
    output = PreTrainingOutput(
        mlm_logits=jnp.asarray(mlm_logits, jnp.float32),
        nsp_logits=jnp.asarray(nsp_logits, jnp.float32),
        hidden_states=jnp.zeros((3, 6, 1)),
    )
    return output, batch


EXPECTED_NSP = -(np.log(0.8) + np.log(0.6) + np.log(0.3) + np.log(0.9)) / 4


@pytest.mark.parametrize(
    "normalization, expected_mlm, mlm_count",
    [
        # Sequences: (ln2 + ln4) / 2, ln4, ln4; the sequence without predictions is left out.
        ("per_sequence", (1.5 + 2 + 2) / 3 * LN2, 3),
        # Predictions: ln2, ln4, ln4, ln4.
        ("per_token", (1 + 2 + 2 + 2) / 4 * LN2, 4),
    ],
)
def test_hand_computed_values(normalization, expected_mlm, mlm_count):
    output, batch = _example()
    loss, metrics = pretraining_loss(output, batch, mlm_normalization=normalization)
    np.testing.assert_allclose(mean(metrics["mlm_loss"]), expected_mlm, rtol=1e-6)
    assert float(metrics["mlm_loss"][1]) == mlm_count
    np.testing.assert_allclose(mean(metrics["nsp_loss"]), EXPECTED_NSP, rtol=1e-6)
    assert float(metrics["nsp_loss"][1]) == 4
    np.testing.assert_allclose(loss, expected_mlm + EXPECTED_NSP, rtol=1e-6)
    assert [float(x) for x in metrics["mlm_accuracy"]] == [1.0, 4.0]
    assert [float(x) for x in metrics["nsp_accuracy"]] == [3.0, 4.0]


def test_masked_lm_accuracy_counts_every_real_prediction_once():
    output, batch = _example()
    metrics = losses.masked_lm_eval_metrics(output, batch, mlm_normalization="per_sequence")
    # Independently: argmax over the vocabulary at the weighted predictions (1 right of 4).
    right = np.argmax(np.asarray(output.mlm_logits), -1) == batch["masked_lm_ids"]
    weights = batch["masked_lm_weights"]
    expected = [float((right * weights).sum()), float(weights.sum())]
    assert [float(x) for x in metrics["masked_lm_accuracy"]] == expected == [1.0, 4.0]


def test_metric_sums_aggregate_across_splits():
    output, batch = _example()
    _, full = pretraining_loss(output, batch)
    parts = []
    for rows in (slice(0, 1), slice(1, 3)):
        part_out = jax.tree.map(lambda x, r=rows: x[r], output)
        parts.append(pretraining_loss(part_out, {k: v[rows] for k, v in batch.items()})[1])
    for name, (total, count) in full.items():
        np.testing.assert_allclose(parts[0][name][0] + parts[1][name][0], total, rtol=1e-6)
        assert parts[0][name][1] + parts[1][name][1] == count


def test_unknown_normalization():
    output, batch = _example()
    with pytest.raises(ValueError, match="mlm_normalization"):
        losses.pretraining_loss(output, batch, mlm_normalization="per_row")


def test_cross_entropy_and_hits_match_optax_and_argmax():
    import optax

    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(scale=4.0, size=(3, 5, 97)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 97, size=(3, 5)), jnp.int32)
    labels = labels.at[0, :2].set(jnp.argmax(logits[0, :2], axis=-1))  # some hits
    ce, hits = losses.cross_entropy_and_hits(logits, labels)
    np.testing.assert_allclose(
        ce, optax.softmax_cross_entropy_with_integer_labels(logits, labels), rtol=1e-6
    )
    np.testing.assert_array_equal(hits, jnp.argmax(logits, axis=-1) == labels)
    assert hits.sum() >= 2
    reference = jax.grad(lambda x: optax.softmax_cross_entropy_with_integer_labels(x, labels).sum())
    ours = jax.grad(lambda x: losses.cross_entropy_and_hits(x, labels)[0].sum())
    np.testing.assert_allclose(ours(logits), reference(logits), atol=1e-6)
    # Ties go to the first class, as argmax: collapsed (constant) logits are not 100% accurate.
    tied = jnp.array([[1.0, 3.0, 3.0]])
    assert losses.cross_entropy_and_hits(tied, jnp.array([2]))[1][0] == 0.0
    assert losses.cross_entropy_and_hits(tied, jnp.array([1]))[1][0] == 1.0
    constant = jnp.zeros((4, 97))
    hits = losses.cross_entropy_and_hits(constant, jnp.array([0, 5, 50, 96]))[1]
    np.testing.assert_array_equal(hits, [1.0, 0.0, 0.0, 0.0])
    bf16 = losses.cross_entropy_and_hits(logits.astype(jnp.bfloat16), labels)[0]
    assert bf16.dtype == jnp.float32
