"""Writes this directory's SOAP and Shampoo checkpoints with the code of commit 8ea607a, the last
before SOAP had a state of its own (its eigenbases, Adam's moments and bookkeeping were in
Shampoo's `ShampooState` / `TensorState`). From a checkout of that commit, compiling as the tests do
(`FAST_COMPILE_FLAGS` in tests/conftest.py: other XLA flags round the updates differently):

    XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true" \
      python tests/bert_flax/train/checkpoints_8ea607a/write.py OUT_DIR

Each optimizer trains the parameters below for 3 updates (two refreshes behind it) and saves as
`bert_flax.train` does (`OUT_DIR/{soap,shampoo}/checkpoints/3`) and as `flax.serialization` does
(the optimizer state: `OUT_DIR/{soap,shampoo}.msgpack`); `expected.npz` holds the saved
per-tensor state of the kernels and the next 3 updates' parameters.
"""

import os
import sys

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optim
from bert_flax.train.step import TrainState

RNG = np.random.default_rng(70)
PARAMS = {
    "dense": {"kernel": jnp.zeros((5, 4)), "bias": jnp.zeros(4)},
    "wide": {"kernel": jnp.zeros((3, 12))},  # 12 > max_preconditioner_dim: a diagonal dimension
}
GRADS = [
    jax.tree.map(lambda p: jnp.asarray(RNG.normal(size=p.shape), jnp.float32), PARAMS)
    for _ in range(6)
]
SHARED = dict(
    block_size=4,
    max_preconditioner_dim=8,
    start_preconditioning_step=1,
    preconditioning_compute_steps=2,
)
OPTIMIZERS = {
    "soap": lambda: optim.soap(0.1, b1=0.9, b2=0.99, shampoo_b2=0.9, **SHARED),
    "shampoo": lambda: optim.shampoo(0.1, b2=0.9, **SHARED),
}
SAVED_AT = 3


def main(out: str) -> None:
    # Its name at 8ea607a (today's `bert_flax.train.resume`); the test reads this file's constants.
    from bert_flax.train.checkpointing import Checkpointer

    expected = {}
    for name, make in OPTIMIZERS.items():
        tx = make()
        state = TrainState.create(PARAMS, tx)
        update = jax.jit(tx.update)
        for i, grads in enumerate(GRADS):
            updates, opt_state = update(grads, state.opt_state, state.params)
            opt_state = optim.after_step(tx, opt_state, i)
            params = optax.apply_updates(state.params, updates)
            state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
            if i + 1 == SAVED_AT:
                saver = Checkpointer(os.path.join(out, name), every_steps=1, keep=1)
                saver.save(SAVED_AT, state, {"batches": SAVED_AT}, force=True)
                saver.close()
                with open(os.path.join(out, f"{name}.msgpack"), "wb") as f:
                    f.write(flax.serialization.to_bytes(opt_state))
                for key in ("dense", "wide"):
                    tensor = opt_state[0].tensors[key]["kernel"]
                    for field, value in tensor._asdict().items():
                        for j, leaf in enumerate(jax.tree.leaves(value)):
                            expected[f"{name}/{key}/{field}/{j}"] = np.asarray(leaf)
            if i + 1 > SAVED_AT:
                for key in ("dense", "wide"):
                    expected[f"{name}/params_{i + 1}/{key}"] = np.asarray(params[key]["kernel"])
    np.savez(os.path.join(out, "expected.npz"), **expected)


if __name__ == "__main__":
    main(sys.argv[1])
