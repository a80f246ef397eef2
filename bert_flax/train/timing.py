"""Timing training steps side by side: several setups' steps in turns, so that the load of a
shared machine hits them alike (what the demo and the benchmarks compare with)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Timing:
    """One setup's side-by-side timing: sequences/s and seconds per step of each timed round."""

    round_rates: tuple[float, ...]
    round_step_seconds: tuple[float, ...]

    @property
    def sequences_per_second(self) -> float:
        return float(np.median(self.round_rates))

    @property
    def step_seconds(self) -> float:
        return float(np.median(self.round_step_seconds))

    @property
    def spread(self) -> float:
        """The interquartile range of the rounds' sequences/s over their median."""
        q1, q3 = np.percentile(self.round_rates, [25, 75])
        return float((q3 - q1) / self.sequences_per_second)


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> tuple[float, float]:
    """The median over rounds of two setups' ratio within each round (of `Timing.round_rates` or
    `round_step_seconds`: robust to load that drifts between rounds), and that median's relative
    standard error (from the ratios' interquartile range, as for a normal sample: 1.253 sigma /
    sqrt(rounds))."""
    ratios = np.asarray(numerator) / np.asarray(denominator)
    q1, q2, q3 = np.percentile(ratios, [25, 50, 75])
    sigma = (q3 - q1) / 1.349
    return float(q2), float(1.253 * sigma / np.sqrt(len(ratios)) / q2)


def in_turns(calls: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each call (which blocks until its result is ready), the calls taking
    turns in every repeat, so that a shared machine's load falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def side_by_side(
    setups: Mapping[str, Any], batches: Mapping[str, list], *, rounds: int, steps: int
) -> dict[str, Timing]:
    """Times each setup's training-loop step (`TrainSetup.loop_step`: the jitted train step,
    then the optimizer's host work, as `train.train_and_evaluate` runs it) on its `batches`.

    The setups take turns, `steps` steps each (one timed interval), for `rounds` rounds after a
    round that compiles and warms up, so that the load of a shared machine hits them alike; each
    cycles through all of its batches across the rounds.
    """
    states = {name: setup.state for name, setup in setups.items()}
    counts = {name: int(setup.state.step) for name, setup in setups.items()}
    starts = dict(counts)
    rates: dict[str, list[float]] = {name: [] for name in setups}
    step_seconds: dict[str, list[float]] = {name: [] for name in setups}
    for round_index in range(rounds + 1):
        for name, setup in setups.items():
            sequences = []
            start = time.perf_counter()
            for _ in range(steps):
                batch = batches[name][(counts[name] - starts[name]) % len(batches[name])]
                counts[name] += 1
                states[name], metrics = setup.loop_step(
                    states[name], batch, setup.step_key(counts[name]), counts[name]
                )
                sequences.append(metrics["sequences"])
            total = float(sum(jax.device_get(sequences)))
            seconds = time.perf_counter() - start
            if round_index:
                rates[name].append(total / seconds)
                step_seconds[name].append(seconds / steps)
    return {name: Timing(tuple(rates[name]), tuple(step_seconds[name])) for name in setups}
