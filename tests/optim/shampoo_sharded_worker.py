"""Run by test_optim_shampoo_sharded.py on 2 simulated CPU devices: `python -m
tests.optim.shampoo_sharded_worker shampoo|soap` trains a linear map 8 steps on one device and on
a 2-device data mesh (synchronous and asynchronous roots) and checks they agree; prints OK."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import optim


def loss(params, x, y):
    return jnp.mean((x @ params["kernel"] + params["bias"] - y) ** 2)


def run(tx, params, x, y, steps=8):
    """`steps` steps of `tx`; the optimizer state keeps its shardings and nothing recompiles."""

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


def main(optimizer: str) -> None:
    assert jax.device_count() == 2, jax.devices()
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(32, 16)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(32, 8)), jnp.float32)
    params = {"kernel": jnp.asarray(rng.normal(size=(16, 8)), jnp.float32), "bias": jnp.zeros(8)}
    make = getattr(optim, optimizer)
    kw = dict(start_preconditioning_step=2, preconditioning_compute_steps=3)
    # One device; the mesh reduces in another order, so agreement is to float32 noise.
    reference, _ = run(make(0.05, **kw), params, x, y)

    def shard(a, spec):
        return jax.device_put(a, NamedSharding(mesh, spec))

    sharded_params = {
        "kernel": shard(params["kernel"], P("data", None)),
        "bias": shard(params["bias"], P()),
    }
    xs, ys = shard(x, P("data", None)), shard(y, P("data", None))
    for mode in ({}, {"asynchronous": True, "max_staleness": 0}):
        got, opt_state = run(make(0.05, **kw, **mode), sharded_params, xs, ys)
        want = sharded_params["kernel"].sharding
        assert got["kernel"].sharding.is_equivalent_to(want, 2), got["kernel"].sharding
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4), got, reference
        )
        inner = opt_state[0]
        assert int(inner.bases_step if optimizer == "soap" else inner.roots_step) == 8, mode
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
