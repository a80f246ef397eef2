"""The most rows a step whose train and eval steps fit a chip's HBM, by bisection over compiles."""

from __future__ import annotations

import ml_collections
from absl import logging

from bert_flax import sharding
from bert_flax.aot import roofline, targets


def largest_batch(
    config: ml_collections.ConfigDict,
    target: targets.Target,
    packing_factor: float | None = None,
    *,
    limit: int = 1 << 16,
    **fractions: float,
) -> tuple[int, roofline.Report | None]:
    """The most rows per step (a multiple of the data shards, no accumulation) whose train and
    eval steps fit the chip's HBM, by bisection over compiles, and the report at it (0, None:
    not even one row a shard fits). The config's packing adjustment is turned off so that the
    rows are the ones compiled; `fractions`: the attention fractions `compile_steps` takes."""
    devices = targets.compile_only_devices(target)
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.packing_hparams, config.train.accumulation = "none", 1
    shards = sharding.data_parallel_size(sharding.mesh_of(config.mesh, devices))
    reports: dict[int, roofline.Report] = {}

    def fits(units: int) -> bool:
        config.train.batch_size = config.eval.batch_size = units * shards
        report = reports[units] = roofline.compile_for(
            config, target, packing_factor, devices, **fractions
        )
        logging.info(
            "largest batch: %d rows %s (HBM %.2f of %.2f GiB a device; compiled in %.0f s)",
            units * shards,
            "fit" if report.fits else "do not fit",
            report.peak_memory / targets.GIB,
            target.chip.hbm_bytes / targets.GIB,
            sum(report.compile_s.values()),
        )
        return report.fits

    low, high = 0, 1  # fits(low) (or low == 0); find the first high that does not fit
    while high * shards <= limit and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low * shards, reports.get(low)
