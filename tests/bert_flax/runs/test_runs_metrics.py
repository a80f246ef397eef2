"""timing.side_by_side against setups whose step time and host work are known."""

import dataclasses
import time
import types

import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.train import timing
from bert_flax.train.setup import TrainSetup


@dataclasses.dataclass(frozen=True)
class FakeState:
    step: int
    opt_state: tuple = ()

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


class RecordingHost:
    """Host hooks that record the update numbers the loop hands them."""

    def __init__(self):
        self.steps = []

    def after_step(self, opt_state, step):
        self.steps.append(step)
        return (*opt_state, step)


def fake_setup(seconds_per_step: float, sequences_per_step: int, start_step: int):
    batches_seen, keys = [], []

    def train_step(state, batch, rng):
        batches_seen.append(batch)
        keys.append(rng)
        time.sleep(seconds_per_step)
        return state, {"sequences": jnp.asarray(sequences_per_step * batch)}

    tx = types.SimpleNamespace(host=RecordingHost())  # what optim.after_step calls
    setup = types.SimpleNamespace(
        state=FakeState(start_step),
        train_step=train_step,
        tx=tx,
        batches_seen=batches_seen,
        keys=keys,
        step_key=lambda step: ("key", step),  # TrainSetup.step_key: the dropout key of a step
    )
    setup.loop_step = lambda *args: TrainSetup.loop_step(setup, *args)  # the real loop step
    return setup


def test_side_by_side_times_each_setup_and_runs_its_host_work():
    setups = {"slow": fake_setup(0.02, 4, start_step=0), "fast": fake_setup(0.005, 3, 7)}
    batches = {"slow": [1], "fast": [1, 2, 3]}  # the fast setup's hold 3, 6, 9 sequences
    timings = timing.side_by_side(setups, batches, rounds=4, steps=4)

    assert len(timings["slow"].round_rates) == 4  # the warm-up round is not timed
    assert timings["slow"].step_seconds == pytest.approx(0.02, rel=0.5)
    assert timings["fast"].step_seconds == pytest.approx(0.005, rel=0.8)
    assert timings["slow"].sequences_per_second == pytest.approx(4 / 0.02, rel=0.5)
    assert timings["fast"].sequences_per_second == pytest.approx(6 / 0.005, rel=0.8)
    assert setups["fast"].batches_seen == [1, 2, 3] * 6 + [1, 2]  # cycled on across rounds
    assert timings["slow"].spread >= 0
    # Host work after every update, numbered on from the state's own step: 5 rounds x 4 steps.
    assert setups["slow"].tx.host.steps == list(range(1, 21))
    assert setups["fast"].tx.host.steps == list(range(8, 28))
    assert setups["fast"].keys == [("key", step) for step in range(8, 28)]  # each its own

    ratio, error = timing.paired_ratio(timings["fast"].round_rates, timings["slow"].round_rates)
    want = np.median(np.divide(timings["fast"].round_rates, timings["slow"].round_rates))
    assert ratio == pytest.approx(want) and ratio > 2 and 0 <= error < 0.5


def test_paired_ratio_error_shrinks_with_rounds_like_a_normal_sample():
    rng = np.random.default_rng(0)
    for rounds in (16, 400):
        noise = rng.normal(1.0, 0.05, size=rounds)  # 5% per-round noise on the numerator
        ratio, error = timing.paired_ratio(2.0 * noise, np.ones(rounds))
        assert ratio == pytest.approx(2.0, abs=0.1)
        # The median of a normal sample: standard error 1.253 sigma / sqrt(n).
        assert error == pytest.approx(1.253 * 0.05 / np.sqrt(rounds), rel=0.5)


def test_in_turns_alternates_the_calls_and_takes_each_ones_median():
    order = []
    sleeps = {"fast": iter([0.0, 0.05, 0.0]), "slow": iter([0.02, 0.02, 0.08])}

    def call(name):
        order.append(name)
        time.sleep(next(sleeps[name]))

    medians = timing.in_turns({name: lambda name=name: call(name) for name in sleeps}, repeats=3)
    assert order == ["fast", "slow"] * 3  # turns, not one call's repeats in a row
    assert medians["fast"] < 0.015 < medians["slow"] < 0.05  # medians, not means or last
