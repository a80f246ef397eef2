"""Shampoo and SOAP under jax.jit with NamedSharding on a simulated 2-device mesh (subprocess)."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import NamedSharding, PartitionSpec as P
    import optim

    assert jax.device_count() == 2, jax.devices()
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(32, 16)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(32, 8)), jnp.float32)
    params = {"kernel": jnp.asarray(rng.normal(size=(16, 8)), jnp.float32), "bias": jnp.zeros(8)}
    loss = lambda p, x, y: jnp.mean((x @ p["kernel"] + p["bias"] - y) ** 2)

    def run(tx, params, x, y, steps=8):
        @jax.jit
        def step(params, opt_state, x, y):
            grads = jax.grad(loss)(params, x, y)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        opt_state = jax.jit(tx.init)(params)
        for i in range(steps):
            before = jax.tree.map(lambda a: a.sharding, opt_state)
            params, opt_state = step(params, opt_state, x, y)
            opt_state = optim.after_step(tx, opt_state, i)
            after = jax.tree.map(lambda a: a.sharding, opt_state)
            assert before == after or i == 0, (i, before, after)
            if i == 1:
                compiled = step._cache_size()  # after step 0's input shardings (from init)
        assert step._cache_size() == compiled, "swapped-in roots caused a recompilation"
        return params, opt_state

    make = getattr(optim, sys.argv[1])  # shampoo or soap
    kw = dict(start_preconditioning_step=2, preconditioning_compute_steps=3)
    # One device; the mesh reduces in another order, so agreement is to float32 noise.
    reference, _ = run(make(0.05, **kw), params, x, y)

    shard = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
    sharded_params = {"kernel": shard(params["kernel"], P("data", None)),
                      "bias": shard(params["bias"], P())}
    xs, ys = shard(x, P("data", None)), shard(y, P("data", None))
    for mode in ({}, {"asynchronous": True, "max_staleness": 0}):
        got, opt_state = run(make(0.05, **kw, **mode), sharded_params, xs, ys)
        want = sharded_params["kernel"].sharding
        assert got["kernel"].sharding.is_equivalent_to(want, 2), got["kernel"].sharding
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4),
                     got, reference)
        inner = opt_state[0]
        assert int(inner.bases_step if sys.argv[1] == "soap" else inner.roots_step) == 8, mode
    print("OK")
    """
)


@pytest.mark.slow  # a fresh JAX process compiling six steps
@pytest.mark.parametrize("optimizer", ["shampoo", "soap"])
def test_on_two_device_mesh_matches_one_device(optimizer):
    env = {
        **os.environ,
        "JAX_NUM_CPU_DEVICES": "2",
        "JAX_PLATFORMS": "cpu",
    }
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, optimizer],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
