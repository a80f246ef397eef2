"""Shampoo and SOAP under jax.jit with NamedSharding on a simulated 2-device mesh (subprocess:
shampoo_sharded_worker.py)."""

import pytest


@pytest.mark.slow  # a fresh JAX process compiling six steps
@pytest.mark.parametrize("optimizer", ["shampoo", "soap"])
def test_on_two_device_mesh_matches_one_device(run_on_devices, optimizer):
    run_on_devices("tests.optim.shampoo_sharded_worker", 2, optimizer, timeout=300)
