"""One train step on 8 simulated CPU devices (data x model = 4 x 2) equals the 1-device step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.paths import ROOT

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_step_worker.py")

# Tolerance: float32 reductions run in a different order once split over devices; LAMB's
# per-layer trust ratio and the 1e-2 learning rate keep a step's change around 1e-2.
PARAM_ATOL = 2e-5
LOSS_RTOL = 1e-5


def run_on_devices(devices: int, *command: str) -> dict:
    """`python *command` with `devices` simulated CPU devices; its last stdout line as JSON."""
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, *command], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow(seconds=70)
def test_eight_devices_match_one():
    """Also with 2 micro-batches on the 8 devices (lax.scan over strided, still-sharded rows)."""
    out = run_on_devices(8, WORKER)
    assert out["param_change"] > 1e-4  # the step moved the parameters
    for accumulation in ("m1", "m2"):
        run = out[accumulation]
        # The 8-device run really splits kernels over the model axis.
        assert any("model" in spec for spec in run["kernel_specs"]), run["kernel_specs"]
        assert run["init_diff"] == 0.0
        assert run["loss"] == pytest.approx(out["loss_1"], rel=LOSS_RTOL)
        assert run["grad_norm_ratio"] == pytest.approx(1.0, rel=1e-4)
        assert run["param_diff"] < PARAM_ATOL, out
    # A per-run rules override moves the parameters: nothing is split over "model" any more,
    # and the step is still the 1-device one.
    run = out["no_model_rules"]
    assert not any("model" in spec for spec in run["kernel_specs"]), run["kernel_specs"]
    assert run["param_diff"] < PARAM_ATOL, out


_FULL_VOCAB_OVER_FOUR = textwrap.dedent(
    """
    import json, sys
    import flax.linen as nn, jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    import conftest
    from bert_flax import sharding
    from bert_flax.data.synthetic import random_batch
    from bert_flax.train.setup import create_train_setup

    config = conftest.tiny_config(**{"train.batch_size": 8})
    config.model.vocab_size = 30522  # 30522 % 4 == 2: the vocab dim is replicated
    config.schedule.warmup_steps = 0
    out, key = {}, jax.random.key(0)
    for name, shape in (("one", (1, 1, 1)), ("four", (1, 1, 4))):
        config.mesh.shape = shape
        devices = jax.devices()[: int(np.prod(shape))]
        setup = create_train_setup(config, mesh=sharding.create_mesh(shape, devices=devices))
        batch = random_batch(8, setup.task.row_shape, vocab_size=30522, seed=2)
        state, metrics = setup.train_step(
            setup.state, sharding.global_batch(setup.mesh, batch), jax.random.key(0)
        )
        params = state.params
        table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
        kernel = params["bert"]["layer_0"]["ffn"]["intermediate"]["kernel"]
        out[name] = {
            "loss": float(metrics["loss"]),
            "table_spec": str(table.sharding.spec),
            "kernel_spec": str(kernel.sharding.spec),
            "table": np.asarray(jax.device_get(table))[:50].tolist(),
        }
    boxed = jax.jit(
        lambda k: setup.model.init(k, batch, deterministic=True),
        out_shardings=sharding.param_shardings(
            jax.eval_shape(lambda k: setup.model.init(k, batch, deterministic=True), key),
            setup.mesh,
            setup.rules,
        ),
    )(key)
    with sharding.partitioning(setup.mesh, setup.rules), jax.set_mesh(setup.mesh):
        unboxed = sharding.unbox(boxed)["params"]["bert"]["embeddings"]["word_embeddings"]
        out["unbox_spec"] = str(unboxed["embedding"].sharding.spec)
        try:
            nn.unbox(boxed)
            out["nn_unbox"] = "ok"
        except ValueError as error:  # jax's IndivisibleError
            out["nn_unbox"] = type(error).__name__
    print(json.dumps(out))
    """
)


@pytest.mark.slow(seconds=50)
def test_full_vocabulary_over_a_four_way_model_axis():
    """The 30,522-word table cannot be split 4 ways: it is replicated (not an error in
    `nn.unbox`), the FFN is split, and the step equals the 1-device step."""
    out = run_on_devices(4, "-c", _FULL_VOCAB_OVER_FOUR, os.path.dirname(WORKER))
    four, one = out["four"], out["one"]
    assert "model" not in four["table_spec"], four["table_spec"]
    assert out["unbox_spec"] == four["table_spec"]
    assert out["nn_unbox"] == "IndivisibleError", out["nn_unbox"]  # why sharding.unbox exists
    assert "model" in four["kernel_spec"], four["kernel_spec"]
    assert four["loss"] == pytest.approx(one["loss"], rel=LOSS_RTOL)
    np.testing.assert_allclose(four["table"], one["table"], atol=PARAM_ATOL)


_SHAMPOO_STATE_SHARDING = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    import conftest
    import optim
    from bert_flax import sharding
    from bert_flax.data.synthetic import random_batch
    from bert_flax.train.setup import create_train_setup

    config = conftest.tiny_config(**{"train.batch_size": 8})
    config.optimizer.name = "shampoo"
    config.optimizer.shampoo.update(block_size=16, start_preconditioning_step=1,
                                    preconditioning_compute_steps=1)
    config.mesh.shape = (2, 2, 2)
    setup = create_train_setup(config)

    def shampoo_state(opt_state):
        found = [x for x in jax.tree_util.tree_leaves(
            opt_state, is_leaf=lambda x: isinstance(x, optim.ShampooState))
            if isinstance(x, optim.ShampooState)]
        assert len(found) == 1, opt_state
        return found[0]

    tensors = shampoo_state(setup.state_shardings.opt_state).tensors
    kernel = ("bert", "layer_0", "ffn", "intermediate", "kernel")
    node, param = tensors, setup.state_shardings.params
    for key in kernel:
        node, param = node[key], param[key]
    batch = random_batch(8, setup.task.row_shape, vocab_size=512, seed=1)
    state, metrics = setup.train_step(
        setup.state, sharding.global_batch(setup.mesh, batch), jax.random.key(0)
    )
    live = shampoo_state(state.opt_state).tensors
    for key in kernel:
        live = live[key]
    print(json.dumps({
        "param": str(param.spec),
        "momentum": str(node.momentum.spec),
        "graft": str(node.graft.spec),
        "stats": [str(s.spec) for s in node.factor_stats],
        "live_momentum": str(live.momentum.sharding.spec),
        "loss": float(metrics["loss"]),
    }))
    """
)


@pytest.mark.slow(seconds=40)
def test_shampoo_momentum_and_graft_are_sharded_like_their_parameter():
    out = run_on_devices(8, "-c", _SHAMPOO_STATE_SHARDING, os.path.dirname(WORKER))
    assert out["param"] == "P('fsdp', 'model')", out
    assert out["momentum"] == out["graft"] == out["live_momentum"] == out["param"], out
    assert all(spec == "P()" for spec in out["stats"]), out  # block statistics
    assert np.isfinite(out["loss"])
