"""SOAP: a float64 numpy reference (steps and basis changes), async == sync, delayed bases,
failures, registration."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optim
from optim.shampoo_core import ShampooConfig
from optim.soap_core import adopt_bases

RNG = np.random.default_rng(0)


def numpy_basis(stat):
    _, q = np.linalg.eigh(stat)
    return q[:, ::-1]


def numpy_soap(grads, lr, b1, b2, shampoo_b2, eps, start, every, statistics_every=1):
    """SOAP on one matrix in float64: the bases from the statistics after update c (c = start,
    start + every, ...) are used from update c + 1, the moments turned into them then; the
    statistics accumulated on updates start + multiples of statistics_every."""
    m, n = grads[0].shape
    left, right = np.zeros((m, m)), np.zeros((n, n))
    q_left, q_right = np.eye(m), np.eye(n)
    first, second = np.zeros((m, n)), np.zeros((m, n))
    updates = []
    for t, g in enumerate(grads, start=1):
        if (t - start) % statistics_every == 0:
            left = shampoo_b2 * left + (1 - shampoo_b2) * g @ g.T
            right = shampoo_b2 * right + (1 - shampoo_b2) * g.T @ g
        rotated = q_left.T @ g @ q_right
        first = b1 * first + (1 - b1) * rotated
        second = b2 * second + (1 - b2) * rotated**2
        adam = (first / (1 - b1**t)) / (np.sqrt(second / (1 - b2**t)) + eps)
        updates.append(-lr * q_left @ adam @ q_right.T)
        if t >= start and (t - start) % every == 0:
            new_left, new_right = numpy_basis(left), numpy_basis(right)
            r_left, r_right = new_left.T @ q_left, new_right.T @ q_right
            first = r_left @ first @ r_right.T
            second = r_left**2 @ second @ (r_right**2).T
            q_left, q_right = new_left, new_right
    return updates


def make_soap(**kw):
    kw = dict(b1=0.9, b2=0.99, shampoo_b2=0.9, start_preconditioning_step=3) | kw
    return optim.soap(0.1, **{"preconditioning_compute_steps": 2} | kw)


def run(tx, grads, *, host=True):
    """Updates of ``tx`` for a sequence of gradients (params fixed at zero), and the states."""
    params = jnp.zeros(grads[0].shape)
    state = tx.init(params)
    update = jax.jit(tx.update)
    out = []
    for i, g in enumerate(grads):
        got, state = update(jnp.asarray(g), state, params)
        if host:
            state = optim.after_step(tx, state, i)
        out.append((np.asarray(got), state))
    return out, update


# Three updates fill both statistics of a 5 x 4 gradient to full rank: its eigenvalues are then
# distinct and its eigenbasis unique up to signs, which SOAP's update does not see.
GRADS = [RNG.normal(size=(5, 4)).astype(np.float32) for _ in range(9)]


def test_matches_numpy_reference_through_basis_changes():
    expected = numpy_soap([g.astype(np.float64) for g in GRADS], 0.1, 0.9, 0.99, 0.9, 1e-8, 3, 2)
    got, _ = run(make_soap(), GRADS)
    for i, ((update, _), want) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(update, want, rtol=1e-3, atol=1e-4, err_msg=f"update {i}")
    # Updates 1-3 are Adam's (identity basis); the bases from updates 3, 5, 7 change the rest.
    adam = optax.adam(0.1, b1=0.9, b2=0.99, eps=1e-8)
    adam_state = adam.init(jnp.zeros((5, 4)))
    for i, g in enumerate(GRADS):
        adam_update, adam_state = adam.update(jnp.asarray(g), adam_state)
        same = np.allclose(got[i][0], adam_update, rtol=1e-4, atol=1e-6)
        assert same == (i < 3), i


def test_statistics_every_other_update_match_numpy_reference():
    args = ([g.astype(np.float64) for g in GRADS], 0.1, 0.9, 0.99, 0.9, 1e-8, 3, 4)
    expected = numpy_soap(*args, statistics_every=2)  # statistics on updates 1, 3, 5, 7, 9
    assert not np.allclose(expected[-1], numpy_soap(*args)[-1], rtol=0.05)  # the test can tell
    got, _ = run(make_soap(preconditioning_compute_steps=4, statistics_compute_steps=2), GRADS)
    for i, ((update, _), want) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(update, want, rtol=1e-3, atol=1e-4, err_msg=f"update {i}")


def test_adopting_a_basis_turns_the_moments_with_it():
    """The first moment is the same vector in the new coordinates; the second too when the new
    basis is the old one reordered and flipped."""
    config = ShampooConfig(graft="none", nesterov=False, preconditioner="eigenbasis")
    old = np.linalg.qr(RNG.normal(size=(5, 5)))[0]
    new = np.linalg.qr(RNG.normal(size=(5, 5)))[0]
    identity_right = np.eye(4)
    first, second = RNG.normal(size=(1, 5, 4)), RNG.uniform(size=(1, 5, 4))
    tensors = optim.SoapTensorState(
        factor_stats=(jnp.zeros((1, 5, 5)), jnp.zeros((1, 4, 4))),
        eigenbases=(jnp.asarray(old[None], jnp.float32), jnp.eye(4)[None]),
        first_moment=jnp.asarray(first, jnp.float32),
        second_moment=jnp.asarray(second, jnp.float32),
    )
    turned = adopt_bases(tensors, [jnp.asarray(new[None]), jnp.eye(4)[None]], config)
    np.testing.assert_allclose(
        new @ turned.first_moment[0] @ identity_right.T, old @ first[0], rtol=1e-5, atol=1e-5
    )
    permuted = old[:, [2, 0, 4, 1, 3]] * np.array([1, -1, 1, -1, 1])
    turned = adopt_bases(tensors, [jnp.asarray(permuted[None]), jnp.eye(4)[None]], config)
    np.testing.assert_allclose(turned.second_moment[0], second[0][[2, 0, 4, 1, 3]], rtol=1e-5)


def test_async_with_zero_staleness_equals_sync_and_does_not_recompile():
    sync, _ = run(make_soap(), GRADS)
    tx = make_soap(asynchronous=True, max_staleness=0)
    asynchronous, update = run(tx, GRADS)
    for i, ((a, _), (b, _)) in enumerate(zip(sync, asynchronous)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"update {i}")
    assert update._cache_size() == 1  # adopted bases and turned moments kept their placement
    metrics = optim.host_metrics(tx, asynchronous[-1][1])
    assert metrics["shampoo/root_jobs"] == 4 and metrics["shampoo/root_failures"] == 0


def test_delayed_bases_are_the_due_ones_and_the_graph_computes_none():
    never, _ = run(make_soap(asynchronous=True), GRADS[:5], host=False)
    for basis in never[-1][1][0].tensors.eigenbases:
        np.testing.assert_array_equal(basis[0], np.eye(basis.shape[-1]))
    # The job for the statistics after update 3 goes in 2 updates later: its bases equal those
    # the synchronous mode adopted after update 3 (up to the signs eigh picks).
    sync, _ = run(make_soap(), GRADS[:3])
    delayed, _ = run(make_soap(asynchronous=True, max_staleness=2, swap_when_done=False), GRADS)
    assert [int(s[0].bases_step) for _, s in delayed[:6]] == [0, 0, 0, 0, 3, 3]
    adopted = delayed[4][1][0].tensors.eigenbases
    for got, want in zip(adopted, sync[-1][1][0].tensors.eigenbases):
        np.testing.assert_allclose(np.abs(got), np.abs(want), atol=1e-5)


def test_non_finite_statistics_keep_the_basis_and_are_counted():
    grads = [*GRADS[:3], np.full((5, 4), np.nan, np.float32)]
    out, _ = run(make_soap(start_preconditioning_step=4), grads)
    state = out[-1][1][0]
    assert int(state.basis_failures) == 2  # both factors of the kernel
    for basis in state.tensors.eigenbases:
        np.testing.assert_array_equal(basis[0], np.eye(basis.shape[-1]))


def test_registered_and_validated():
    tx = optim.create({"name": "soap", "soap": {"b1": 0.9}}, learning_rate=1e-3)
    assert isinstance(tx, optim.HostTransformation)
    assert "shampoo_b2" in optim.hyperparameters("soap")
    with pytest.raises(ValueError, match="graft='none'"):
        ShampooConfig(preconditioner="eigenbasis")
    with pytest.raises(ValueError, match="preconditioner"):
        ShampooConfig(preconditioner="svd")


def test_elementwise_params_get_plain_adam():
    """The parameters `elementwise_params` names move by optax's Adam at every update, through
    basis changes; the others by SOAP (the numpy reference)."""
    tx = make_soap(elementwise_params="^embed/")
    params = {"embed": {"table": jnp.zeros((5, 4))}, "dense": jnp.zeros((5, 4))}
    adam = optax.adam(0.1, b1=0.9, b2=0.99, eps=1e-8)
    adam_state, state = adam.init(params["embed"]["table"]), tx.init(params)
    update = jax.jit(tx.update)
    expected = numpy_soap([g.astype(np.float64) for g in GRADS], 0.1, 0.9, 0.99, 0.9, 1e-8, 3, 2)
    for i, g in enumerate(GRADS):
        got, state = update({"embed": {"table": g}, "dense": g}, state, params)
        state = optim.after_step(tx, state, i)
        adam_update, adam_state = adam.update(jnp.asarray(g), adam_state)
        np.testing.assert_allclose(got["embed"]["table"], adam_update, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got["dense"], expected[i], rtol=1e-3, atol=1e-4)
