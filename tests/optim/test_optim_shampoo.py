"""Shampoo: a numpy reference, grafting, momentum, decay, async == sync, save/restore, failures."""

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optim
from optim.shampoo_core import ShampooState

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(64, 12)), jnp.float32)
Y = jnp.asarray(RNG.normal(size=(64, 6)), jnp.float32)
PARAMS = {
    "dense": {"kernel": jnp.asarray(RNG.normal(size=(12, 6)), jnp.float32), "bias": jnp.zeros(6)}
}


def regression_loss(params):
    return jnp.mean((X @ params["dense"]["kernel"] + params["dense"]["bias"] - Y) ** 2)


_STEPS = {}  # id(tx) -> (tx, its jitted step): one compilation per transformation


def jitted_step(tx):
    if id(tx) not in _STEPS:

        @jax.jit
        def step(params, opt_state):
            grads = jax.grad(regression_loss)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        _STEPS[id(tx)] = (tx, step)
    return _STEPS[id(tx)][1]


def train(tx, params, steps, *, host=True, opt_state=None, start=0):
    """Jitted steps from ``start``; returns the params and opt_state after each step."""
    step = jitted_step(tx)
    opt_state = tx.init(params) if opt_state is None else opt_state
    history = []
    for i in range(start, start + steps):
        params, opt_state = step(params, opt_state)
        if host:
            opt_state = optim.after_step(tx, opt_state, i)
        history.append((params, opt_state))
    return history


def assert_trees_close(a, b, rtol=1e-6, atol=1e-7):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def numpy_shampoo(g_seq, lr, b2, eps, every=1, statistics_every=1):
    """Shampoo on one matrix: no grafting, no momentum, S = 1; the statistics accumulated on
    updates 1, 1 + statistics_every, ..., roots from those after updates 1, 1 + every, ...
    (used from the next update on)."""

    def root(stat):
        w, q = np.linalg.eigh(stat)
        w = w + eps * w.max()
        return (q * w ** (-0.25)) @ q.T

    left, right = np.zeros((g_seq[0].shape[0],) * 2), np.zeros((g_seq[0].shape[1],) * 2)
    left_root, right_root = np.eye(len(left)), np.eye(len(right))
    updates = []
    for t, g in enumerate(g_seq, start=1):
        if (t - 1) % statistics_every == 0:
            left = b2 * left + (1 - b2) * g @ g.T
            right = b2 * right + (1 - b2) * g.T @ g
        updates.append(-lr * left_root @ g @ right_root)
        if (t - 1) % every == 0:
            left_root, right_root = root(left), root(right)
    return updates


def assert_matches_numpy_shampoo(grads, numpy_kw, rtol, atol, **shampoo_kw):
    """Updates from zero params vs `numpy_shampoo` at its lr, b2, eps (0.1, 0.9, 1e-4).

    `atol` is a fraction of the update's largest entry: float32 roots leave errors of that order
    on its small entries (seen: 1.4e-4 with eigh on entries up to 1.9), while a wrong root is off
    by O(1).
    """
    expected = numpy_shampoo([g.astype(np.float64) for g in grads], 0.1, 0.9, 1e-4, **numpy_kw)
    tx = optim.shampoo(0.1, b1=0.0, b2=0.9, ridge_epsilon=1e-4, graft="none", **shampoo_kw)
    params = jnp.zeros(grads[0].shape)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for g, want in zip(grads, expected):
        got, state = update(jnp.asarray(g), state, params)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * np.abs(want).max())


@pytest.mark.parametrize(
    ("root_method", "rtol", "atol"), [("newton", 2e-3, 1e-4), ("eigh", 1e-2, 2e-4)]
)
def test_matches_numpy_reference(root_method, rtol, atol):
    # (float32 eigh resolves the ridge-sized eigenvalues of these rank-6 statistics less well.)
    grads = [RNG.normal(size=(12, 6)).astype(np.float32) for _ in range(4)]
    assert_matches_numpy_shampoo(
        grads, {}, rtol, atol, preconditioning_compute_steps=1, root_method=root_method
    )


def test_statistics_every_k_updates_match_numpy_reference():
    # Statistics on updates 1, 3, 5, 7; roots from those after updates 1 and 5.
    grads = [RNG.normal(size=(12, 6)).astype(np.float32) for _ in range(8)]
    as_float64 = [g.astype(np.float64) for g in grads]
    sparse = numpy_shampoo(as_float64, 0.1, 0.9, 1e-4, every=4, statistics_every=2)
    dense = numpy_shampoo(as_float64, 0.1, 0.9, 1e-4, every=4)
    assert not np.allclose(sparse[-1], dense[-1], rtol=0.05)  # the test can tell
    assert_matches_numpy_shampoo(
        grads,
        {"every": 4, "statistics_every": 2},
        2e-3,
        1e-4,
        preconditioning_compute_steps=4,
        statistics_compute_steps=2,
    )


def test_grafting_sets_each_blocks_step_size():
    tx = optim.shampoo(
        1.0,
        b1=0.0,
        graft="sgd",
        block_size=128,
        start_preconditioning_step=1,
        preconditioning_compute_steps=1,
    )
    params = jnp.zeros((300, 50))
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(2):
        g = jnp.asarray(RNG.normal(size=(300, 50)), jnp.float32)
        u, state = update(g, state, params)
    for i in range(3):  # 300 rows -> 3 blocks of 100
        rows = slice(100 * i, 100 * (i + 1))
        np.testing.assert_allclose(jnp.linalg.norm(u[rows]), jnp.linalg.norm(g[rows]), rtol=1e-5)
    assert not np.allclose(u / jnp.linalg.norm(u), -g / jnp.linalg.norm(g), atol=1e-3)


def test_momentum_and_decoupled_weight_decay():
    params = {"kernel": jnp.ones((4, 3)), "bias": jnp.ones(3)}
    grads = [jax.tree.map(lambda p, i=i: (i + 1.0) * jnp.ones_like(p), params) for i in range(3)]
    for nesterov in (False, True):
        # Until start_preconditioning_step the (sgd-)grafted direction is the gradient itself.
        # (asynchronous: no roots in the graph, a faster compile; none are due here anyway.)
        tx = optim.shampoo(
            0.5,
            asynchronous=True,
            b1=0.9,
            nesterov=nesterov,
            graft="sgd",
            weight_decay=0.1,
            start_preconditioning_step=100,
        )
        state, m, update = tx.init(params), 0.0, jax.jit(tx.update)
        for g in grads:
            u, state = update(g, state, params)
            m = 0.9 * m + 0.1 * g["bias"][0]
            step = 0.9 * m + 0.1 * g["bias"][0] if nesterov else m
            np.testing.assert_allclose(u["bias"], -0.5 * step, rtol=1e-6)  # no decay on biases
            np.testing.assert_allclose(u["kernel"], -0.5 * (step + 0.1), rtol=1e-6)


def rotated(rng, n, d, spread):
    """An n x d matrix with singular values logspace(0, -spread) and random singular vectors."""
    z, _ = np.linalg.qr(rng.normal(size=(n, d)))
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return jnp.asarray((z * np.logspace(0, -spread, d)) @ q.T, jnp.float32)


def test_shampoo_beats_adam_on_ill_conditioned_least_squares():
    # min_W |A W B - C|^2 with A, B conditioned 10^1.5 on both sides (Hessian condition 1e6),
    # rotated so that no diagonal preconditioner can fix it.
    rng = np.random.default_rng(1)
    a, b = rotated(rng, 64, 32, 1.5), rotated(rng, 16, 16, 1.5)
    c = a @ jnp.asarray(rng.normal(size=(32, 16)), jnp.float32) @ b
    loss = lambda w: jnp.sum((a @ w @ b - c) ** 2)
    target, max_steps = 1e-4 * float(loss(jnp.zeros((32, 16)))), 300

    def steps_to_target(make_tx):
        @jax.jit
        def losses(lr):
            tx = make_tx(lr)

            def step(carry, _):
                w, state = carry
                value, g = jax.value_and_grad(loss)(w)
                u, state = tx.update(g, state, w)
                return (w + u, state), value

            w = jnp.zeros((32, 16))
            return jax.lax.scan(step, (w, tx.init(w)), None, length=max_steps)[1]

        best = max_steps + 1
        for lr in (1e-2, 3e-2, 1e-1, 3e-1, 1.0):
            hits = np.flatnonzero(np.asarray(losses(lr)) <= target)
            best = min(best, hits[0] if hits.size else max_steps + 1)
        return best

    adam = steps_to_target(optax.adam)
    shampoo = steps_to_target(
        lambda lr: optim.shampoo(lr, start_preconditioning_step=5, preconditioning_compute_steps=5)
    )
    assert shampoo * 2 <= adam, (shampoo, adam)


def make_shampoo(**kw):
    kw = {"start_preconditioning_step": 2, "preconditioning_compute_steps": 3, **kw}
    return optim.create("shampoo", learning_rate=0.05, **kw)


def test_async_with_zero_staleness_equals_sync_step_for_step():
    sync = train(make_shampoo(), PARAMS, 12)
    tx = make_shampoo(asynchronous=True, max_staleness=0)
    asynchronous = train(tx, PARAMS, 12)
    for (p_sync, s_sync), (p_async, s_async) in zip(sync, asynchronous):
        assert_trees_close(p_sync, p_async)
        assert int(s_sync[0].roots_step) == int(s_async[0].roots_step)
    assert int(asynchronous[-1][1][0].roots_step) == 11  # refreshed after updates 2, 5, 8, 11
    assert jitted_step(tx)._cache_size() == 1  # swapped-in roots did not cause a recompilation
    metrics = optim.host_metrics(tx, asynchronous[-1][1])
    assert metrics["shampoo/root_jobs"] == 4 and metrics["shampoo/staleness"] == 0
    assert metrics["shampoo/root_failures"] == 0 and metrics["shampoo/roots_age"] == 1
    assert metrics["shampoo/root_seconds"] > 0


def test_async_graph_computes_no_roots_and_delayed_roots_are_the_due_ones():
    never_called = train(make_shampoo(asynchronous=True), PARAMS, 6, host=False)
    kernel = never_called[-1][1][0].tensors["dense"]["kernel"]
    for root in kernel.factor_roots:
        np.testing.assert_array_equal(root, jnp.broadcast_to(jnp.eye(root.shape[-1]), root.shape))

    # The job for the statistics after update 2 is swapped in exactly 2 updates later (after
    # update 4): its roots are the ones the synchronous mode computed after update 2.
    sync = train(make_shampoo(), PARAMS, 3)
    tx = make_shampoo(asynchronous=True, max_staleness=2, swap_when_done=False)
    delayed = train(tx, PARAMS, 5)
    assert [int(s[0].roots_step) for _, s in delayed] == [0, 0, 0, 2, 2]
    sync_roots = sync[-1][1][0].tensors["dense"]["kernel"].factor_roots
    assert_trees_close(delayed[3][1][0].tensors["dense"]["kernel"].factor_roots, sync_roots)


def test_skipped_steps_keep_async_refreshes_on_the_optimizers_cadence():
    """The loop skips non-finite steps (no update, its step advances): the host still refreshes
    after updates 2, 5, 8 as the synchronous mode does, from the same statistics."""
    skipped = {1, 3, 4}  # loop steps 0..11 apply 9 updates
    sync = train(make_shampoo(), PARAMS, 9)
    tx = make_shampoo(asynchronous=True, max_staleness=0)
    step, params, opt_state, applied = jitted_step(tx), PARAMS, tx.init(PARAMS), []
    for loop_step in range(12):
        if loop_step not in skipped:
            params, opt_state = step(params, opt_state)
        opt_state = optim.after_step(tx, opt_state, loop_step)
        if loop_step not in skipped:
            applied.append((params, opt_state))
    assert [int(s[0].roots_step) for _, s in applied] == [0, 2, 2, 2, 5, 5, 5, 8, 8]
    for (p_sync, s_sync), (p_async, s_async) in zip(sync, applied):
        assert_trees_close(p_sync, p_async)
        assert int(s_sync[0].roots_step) == int(s_async[0].roots_step)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_save_restore_mid_run_continues_identically(asynchronous):
    kw = {"asynchronous": True, "max_staleness": 0} if asynchronous else {}
    tx = make_shampoo(**kw)
    first = train(tx, PARAMS, 5)
    params, opt_state = first[-1]
    blob = flax.serialization.to_bytes(opt_state)
    uninterrupted = train(tx, params, 7, opt_state=opt_state, start=5)

    # Asynchronous: a new transformation, as in a new process (a new host, no in-flight job).
    fresh_tx = make_shampoo(**kw) if asynchronous else tx
    restored = flax.serialization.from_bytes(fresh_tx.init(PARAMS), blob)
    assert isinstance(restored[0], ShampooState)
    resumed = train(fresh_tx, params, 7, opt_state=restored, start=5)
    for (p_a, _), (p_b, _) in zip(uninterrupted, resumed):
        assert_trees_close(p_a, p_b)


def test_restore_recomputes_a_dropped_in_flight_job():
    tx = make_shampoo(asynchronous=True, max_staleness=3, swap_when_done=False)
    params, opt_state = train(tx, PARAMS, 3)[-1]  # job for update 2 in flight
    assert int(opt_state[0].roots_step) == 0
    fresh_tx = make_shampoo(asynchronous=True, max_staleness=0)
    _, resumed = train(fresh_tx, params, 1, opt_state=opt_state, start=3)[-1]
    assert int(resumed[0].roots_step) == 4  # recomputed at once from the restored statistics

    # With a delay, the recomputed job is still in flight when the next one is due (after
    # update 5): it goes in first and the due job is submitted, not skipped.
    delayed_tx = make_shampoo(asynchronous=True, max_staleness=3, swap_when_done=False)
    _, resumed = train(delayed_tx, params, 2, opt_state=opt_state, start=3)[-1]
    assert int(resumed[0].roots_step) == 4
    metrics = optim.host_metrics(delayed_tx, resumed)
    assert metrics["shampoo/root_jobs"] == 2 and metrics["shampoo/staleness"] == 0


def test_failed_roots_keep_the_previous_ones_and_are_counted():
    tx = make_shampoo(start_preconditioning_step=1, preconditioning_compute_steps=1)
    params, opt_state = train(tx, PARAMS, 2)[-1]
    kernel = opt_state[0].tensors["dense"]["kernel"]
    left, right = kernel.factor_stats
    poisoned = kernel._replace(factor_stats=(left.at[0, 0, 0].set(jnp.nan), right))
    tensors = {"dense": {**opt_state[0].tensors["dense"], "kernel": poisoned}}
    opt_state = (opt_state[0]._replace(tensors=tensors), *opt_state[1:])
    params, after = train(tx, params, 2, opt_state=opt_state, start=2)[-1]
    assert int(after[0].root_failures) == 2  # the left factor failed at both refreshes
    new_kernel = after[0].tensors["dense"]["kernel"]
    np.testing.assert_array_equal(new_kernel.factor_roots[0], kernel.factor_roots[0])
    assert not np.array_equal(new_kernel.factor_roots[1], kernel.factor_roots[1])
    assert all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(params))
    assert optim.host_metrics(tx, after)["shampoo/root_failures"] == 2


def test_bad_hyperparameters_are_rejected_clearly():
    with pytest.raises(ValueError, match="graft='lion' must be one of"):
        optim.shampoo(1e-3, graft="lion")
    with pytest.raises(ValueError, match="max_staleness=20 must lie in"):
        optim.shampoo(1e-3, asynchronous=True, max_staleness=20)
    with pytest.raises(ValueError, match=r"float64. needs asynchronous=True"):
        optim.shampoo(1e-3, host_root_dtype="float64")
    with pytest.raises(ValueError, match="statistics_compute_steps=3 must divide"):
        optim.shampoo(1e-3, preconditioning_compute_steps=10, statistics_compute_steps=3)
    tx = make_shampoo(asynchronous=True)
    with pytest.raises(ValueError, match="exactly one ShampooState"):
        optim.after_step(tx, (), 0)


def test_vectors_can_take_the_graft_direction_alone():
    """precondition_vectors=False: a bias moves by the Adam graft's direction (bias-corrected
    RMSProp, no momentum here), computed by hand; a matrix is still preconditioned."""
    b2, eps = 0.99, 1e-8
    tx = optim.shampoo(
        1.0,
        b1=0.0,
        graft="adam",
        graft_b2=b2,
        graft_epsilon=eps,
        precondition_vectors=False,
        start_preconditioning_step=1,
        preconditioning_compute_steps=1,
    )
    params = {"bias": jnp.zeros(6), "kernel": jnp.zeros((6, 4))}
    state = tx.init(params)
    update = jax.jit(tx.update)
    second = np.zeros(6)
    for t in range(1, 4):
        grads = {
            "bias": jnp.asarray(RNG.normal(size=6), jnp.float32),
            "kernel": jnp.asarray(RNG.normal(size=(6, 4)), jnp.float32),
        }
        updates, state = update(grads, state, params)
        g = np.asarray(grads["bias"], np.float64)
        second = b2 * second + (1 - b2) * g**2
        expected = -g / (np.sqrt(second / (1 - b2**t)) + eps)
        np.testing.assert_allclose(updates["bias"], expected, rtol=1e-5)
    tensor = state[0].tensors
    assert tensor["bias"].diagonal_stats == () and len(tensor["kernel"].factor_stats) == 2


def test_elementwise_params_are_preconditioned_as_vectors():
    """A matrix that `elementwise_params` names moves as its flattened copy (a vector) does, with
    no Kronecker factors; the others keep theirs. A bad regex is a clear error."""
    tx = make_shampoo(elementwise_params="embed", start_preconditioning_step=1)
    params = {
        "embed": {"table": jnp.zeros((6, 4))},
        "flat": jnp.zeros(24),
        "dense": jnp.zeros((6, 4)),
    }
    state = tx.init(params)
    update = jax.jit(tx.update)
    for step in range(3):
        table = jnp.asarray(RNG.normal(size=(6, 4)), jnp.float32)
        grads = {"embed": {"table": table}, "flat": table.reshape(-1), "dense": table}
        updates, state = update(grads, state, params)
        # float32 reductions over a (6, 4) and a (24,) array may round differently (seen: 1.4e-6).
        np.testing.assert_allclose(
            updates["embed"]["table"].reshape(-1), updates["flat"], rtol=1e-5
        )
        # Update 1 is the graft's everywhere; the roots from its statistics act from update 2.
        preconditioned = not np.allclose(updates["dense"], updates["embed"]["table"], rtol=1e-3)
        assert preconditioned == (step > 0), step
    tensors = state[0].tensors
    assert tensors["embed"]["table"].factor_stats == () and len(tensors["dense"].factor_stats) == 2
    with pytest.raises(ValueError, match=r"elementwise_params='\(' is no regex"):
        optim.shampoo(1e-3, elementwise_params="(")
