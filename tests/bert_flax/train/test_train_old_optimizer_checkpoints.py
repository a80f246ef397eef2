"""SOAP and Shampoo checkpoints written by commit 8ea607a (SOAP's state then in Shampoo's layout)
restore with the state's values (orbax, as bert_flax.train saves, and flax.serialization) and the
next updates equal those 8ea607a computed."""

import os
import runpy
import shutil

import flax.serialization
import jax
import numpy as np
import optax
import pytest

import optim
from bert_flax.train.resume import Checkpointer
from bert_flax.train.step import TrainState
from optim import soap_core

FIXTURES = os.path.join(os.path.dirname(__file__), "checkpoints_8ea607a")
WRITER = runpy.run_path(os.path.join(FIXTURES, "write.py"))  # its parameters, gradients, options
# Each per-tensor field of today's state and the field of 8ea607a's `TensorState` it was saved as.
FIELDS = {
    "soap": {
        "factor_stats": "factor_stats",
        "eigenbases": "factor_roots",
        "first_moment": "momentum",
        "second_moment": "graft",
    },
    "shampoo": {f: f for f in optim.TensorState._fields},
}


def restore(name: str, workdir: str) -> tuple[optax.GradientTransformation, TrainState]:
    shutil.copytree(os.path.join(FIXTURES, name), workdir)  # restoring may move files aside
    tx = WRITER["OPTIMIZERS"][name]()
    state = TrainState.create(WRITER["PARAMS"], tx)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored, progress = Checkpointer(workdir, every_steps=1, keep=1).restore_latest(
        state, jax.tree.map(lambda _: device, state)
    )
    assert progress == {"batches": WRITER["SAVED_AT"]}
    return tx, restored


def assert_saved_values(name: str, inner: optim.SoapState | optim.ShampooState) -> dict:
    """Asserts the restored optimizer state holds 8ea607a's values; returns what is left of
    expected.npz (the updates after it)."""
    expected = dict(np.load(os.path.join(FIXTURES, "expected.npz")))
    assert isinstance(inner, optim.SoapState if name == "soap" else optim.ShampooState)
    assert int(inner.count) == 3  # refreshed after updates 1 and 3:
    assert int(inner.bases_step if name == "soap" else inner.roots_step) == 3
    for key in ("dense", "wide"):
        tensor = inner.tensors[key]["kernel"]
        for field, saved_as in FIELDS[name].items():
            for j, leaf in enumerate(jax.tree.leaves(getattr(tensor, field))):
                np.testing.assert_array_equal(leaf, expected.pop(f"{name}/{key}/{saved_as}/{j}"))
    assert not [k for k in expected if k.startswith(f"{name}/") and "params" not in k]
    return expected


@pytest.mark.parametrize("name", ["soap", "shampoo"])
def test_flax_serialized_state_of_8ea607a_restores(name):
    tx = WRITER["OPTIMIZERS"][name]()
    target = tx.init(WRITER["PARAMS"])
    with open(os.path.join(FIXTURES, f"{name}.msgpack"), "rb") as f:
        blob = f.read()
    legacy = soap_core.legacy_layout(target)  # what docs/optim.md shows
    if name == "soap":
        restored = soap_core.from_legacy_layout(flax.serialization.from_bytes(legacy, blob), target)
    else:
        assert legacy is None  # Shampoo's layout is unchanged
        restored = flax.serialization.from_bytes(target, blob)
    assert_saved_values(name, restored[0])


@pytest.mark.parametrize("name", ["soap", "shampoo"])
def test_checkpoint_of_8ea607a_restores_and_continues_identically(name, tmp_path):
    tx, state = restore(name, str(tmp_path / name))
    assert int(state.step) == 3
    expected = assert_saved_values(name, state.opt_state[0])

    update = jax.jit(tx.update)
    for i in range(WRITER["SAVED_AT"], len(WRITER["GRADS"])):
        updates, opt_state = update(WRITER["GRADS"][i], state.opt_state, state.params)
        opt_state = optim.after_step(tx, opt_state, i)
        state = state.replace(
            params=optax.apply_updates(state.params, updates), opt_state=opt_state
        )
        for key in ("dense", "wide"):
            want = expected.pop(f"{name}/params_{i + 1}/{key}")
            np.testing.assert_array_equal(state.params[key]["kernel"], want, err_msg=f"{i}")
    assert not [k for k in expected if k.startswith(f"{name}/")]


def test_soap_checkpoint_of_today_restores_in_its_own_layout(tmp_path):
    tx = WRITER["OPTIMIZERS"]["soap"]()
    state = TrainState.create(WRITER["PARAMS"], tx)
    update = jax.jit(tx.update)
    for grads in WRITER["GRADS"][:3]:
        updates, opt_state = update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    saver = Checkpointer(str(tmp_path), every_steps=1, keep=1)
    saver.save(3, state, {"batches": 3}, force=True)
    saver.close()
    fresh = TrainState.create(WRITER["PARAMS"], tx)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored, _ = Checkpointer(str(tmp_path), every_steps=1, keep=1).restore_latest(
        fresh, jax.tree.map(lambda _: device, fresh)
    )
    assert isinstance(restored.opt_state[0], optim.SoapState)
    jax.tree.map(np.testing.assert_array_equal, restored, state)
