"""Packing equivalence: sequences packed into shared rows behave exactly as one per padded row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.losses import per_sequence_terms, pretraining_loss

# Layout of the packed batch: row 0 holds sequences 0, 1, 3; row 1 holds sequence 2 alone
# (two empty slots). Each entry: (row, slot) of sequence i.
PACKED_ROWS = ((0, 1, 3), (2,))
PACKED_LENGTH, PACKED_SLOTS, PACKED_PREDICTIONS = 24, 3, 8
PADDED_LENGTH, PADDED_PREDICTIONS = 16, 4


def _locations(sequences):
    """sequence index -> (row, slot, token offset, prediction offset) in the packed batch."""
    where = {}
    for r, row in enumerate(PACKED_ROWS):
        offset = pred = 0
        for d, i in enumerate(row):
            where[i] = (r, d, offset, pred)
            offset += len(sequences[i].input_ids)
            pred += len(sequences[i].masked_positions)
    return where


@pytest.fixture(scope="module")
def batches(sequences, make_batch):
    padded = make_batch([[s] for s in sequences], PADDED_LENGTH, 1, PADDED_PREDICTIONS)
    packed = make_batch(
        [[sequences[i] for i in row] for row in PACKED_ROWS],
        PACKED_LENGTH,
        PACKED_SLOTS,
        PACKED_PREDICTIONS,
    )
    return padded, packed


@pytest.fixture(scope="module", params=["absolute", "relative_attention"])
def setup(request, tiny_config, batches, random_variables):
    """BERT's absolute positions, and with a relative-position bias (random, so it matters)."""
    config = tiny_config
    if request.param == "relative_attention":
        config = config.replace(relative_attention_buckets=8, relative_attention_max_distance=16)
    model = BertForPreTraining(config)
    variables = random_variables(model, batches[0])
    apply = jax.jit(lambda v, b: model.apply(v, b, deterministic=True))
    return model, variables, apply


@pytest.fixture(scope="module")
def outputs(batches, setup):
    _, variables, apply = setup
    return tuple(apply(variables, b) for b in batches)


def test_hidden_states_and_logits_match(sequences, outputs):
    out_pad, out_pack = outputs
    for i, (r, d, offset, pred) in _locations(sequences).items():
        n, m = len(sequences[i].input_ids), len(sequences[i].masked_positions)
        np.testing.assert_allclose(
            out_pack.hidden_states[r, offset : offset + n],
            out_pad.hidden_states[i, :n],
            atol=1e-5,
            err_msg=f"hidden states of sequence {i}",
        )
        np.testing.assert_allclose(
            out_pack.mlm_logits[r, pred : pred + m], out_pad.mlm_logits[i, :m], atol=1e-5
        )
        np.testing.assert_allclose(out_pack.nsp_logits[r, d], out_pad.nsp_logits[i, 0], atol=1e-5)


def test_per_sequence_losses_match(sequences, batches, outputs):
    padded, packed = batches
    terms = jax.jit(per_sequence_terms)
    t_pad, t_pack = terms(outputs[0], padded), terms(outputs[1], packed)
    for i, (r, d, _, _) in _locations(sequences).items():
        assert t_pack["mlm_count"][r, d] == len(sequences[i].masked_positions)
        for name in ("mlm_loss_sum", "mlm_count", "mlm_correct", "nsp_loss", "nsp_correct"):
            np.testing.assert_allclose(t_pack[name][r, d], t_pad[name][i, 0], rtol=1e-5, atol=1e-6)
    # Empty slots carry nothing.
    empty = np.asarray(packed["sequence_mask"]) == 0
    assert empty.sum() == 2
    for name in ("mlm_loss_sum", "mlm_count", "nsp_loss", "nsp_correct"):
        assert np.all(np.asarray(t_pack[name])[empty] == 0), name


@pytest.mark.slow(seconds=20)
def test_loss_and_gradients_match(batches, setup):
    padded, packed = batches
    model, variables, _ = setup

    @jax.jit
    def loss_and_grad(v, batch):
        def loss_fn(v):
            return pretraining_loss(model.apply(v, batch, deterministic=True), batch)[0]

        return jax.value_and_grad(loss_fn)(v)

    loss_pad, grad_pad = loss_and_grad(variables, padded)
    loss_pack, grad_pack = loss_and_grad(variables, packed)
    np.testing.assert_allclose(loss_pack, loss_pad, rtol=1e-6)
    flat_pad = jax.tree_util.tree_leaves_with_path(grad_pad)
    flat_pack = jax.tree_util.tree_leaves(grad_pack)
    for (path, g_pad), g_pack in zip(flat_pad, flat_pack):
        # Relative to the leaf's scale; key biases have a zero true gradient (softmax shift).
        atol = max(1e-5 * float(jnp.max(jnp.abs(g_pad))), 1e-8)
        np.testing.assert_allclose(g_pack, g_pad, atol=atol, err_msg=jax.tree_util.keystr(path))


def test_changing_one_sequence_leaves_the_others_unchanged(sequences, batches, setup, outputs):
    _, packed = batches
    _, variables, apply = setup
    perturbed = {k: np.array(v) for k, v in packed.items()}
    r, d, offset, _ = _locations(sequences)[1]
    n = len(sequences[1].input_ids)
    rng = np.random.default_rng(0)
    perturbed["input_ids"][r, offset : offset + n] = rng.integers(4, 97, n)
    perturbed["token_type_ids"][r, offset : offset + n] = 1 - perturbed["token_type_ids"][r, offset]
    # Padding content must not matter either.
    perturbed["input_ids"][perturbed["segment_ids"] == 0] = 5
    base, changed = outputs[1], apply(variables, perturbed)

    own = perturbed["segment_ids"] == d + 1
    assert own.sum() == n
    real_others = (perturbed["segment_ids"] != 0) & ~own
    assert not np.allclose(
        np.asarray(base.hidden_states)[own], np.asarray(changed.hidden_states)[own]
    )
    np.testing.assert_array_equal(
        np.asarray(changed.hidden_states)[real_others], np.asarray(base.hidden_states)[real_others]
    )
    other_slots = np.asarray(packed["sequence_mask"], bool)
    other_slots[r, d] = False
    np.testing.assert_array_equal(
        np.asarray(changed.nsp_logits)[other_slots], np.asarray(base.nsp_logits)[other_slots]
    )


def test_no_nan_on_all_padding_row(tiny_config, batches, setup):
    padded, _ = batches
    _, variables, apply = setup
    empty = {k: np.zeros_like(v) for k, v in padded.items()}
    out = apply(variables, empty)
    assert np.isfinite(np.asarray(out.hidden_states)).all()
    loss, metrics = jax.jit(pretraining_loss)(out, empty)
    assert np.isfinite(loss) and float(loss) == 0.0
    assert all(float(c) == 0 for _, c in metrics.values())
