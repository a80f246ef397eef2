"""The optimizer from the config: schedule, clipping, weight-decay mask, packing adjustments."""

from __future__ import annotations

import dataclasses

import ml_collections
import optax

import optim

PACKING_HPARAMS = ("none", "divide_accumulation", "raise_betas")


@dataclasses.dataclass(frozen=True)
class PackingAdjustment:
    """Hyper-parameters after adapting to the packing factor (Krell et al., 2021, Sec. 4)."""

    packing_factor: float
    batch_size: int  # rows per optimizer step
    accumulation: int
    b1: float | None
    b2: float | None


def adjust_for_packing(
    config: ml_collections.ConfigDict, packing_factor: float, row_multiple: int = 1
) -> PackingAdjustment:
    """Applies `config.train.packing_hparams` for rows holding `packing_factor` sequences.

    "divide_accumulation": about p times fewer rows per step, so a step still sees about as many
    sequences as unpacked: the number of micro-batches is divided by p (or, without accumulation,
    the batch, rounded to a multiple of `row_multiple`, the data-parallel size). "raise_betas":
    same rows, p times more sequences per step, and the betas raised to the power p.
    """
    mode = config.train.packing_hparams
    if mode not in PACKING_HPARAMS:
        raise ValueError(f"config.train.packing_hparams={mode!r} is not one of {PACKING_HPARAMS}.")
    if packing_factor < 1.0:
        raise ValueError(f"packing factor {packing_factor} < 1: rows hold at least one sequence.")
    batch, accumulation = config.train.batch_size, config.train.accumulation
    b1, b2 = config.optimizer.get("b1"), config.optimizer.get("b2")
    if mode == "divide_accumulation":
        if accumulation > 1:
            micro = batch // accumulation
            accumulation = max(1, round(accumulation / packing_factor))
            batch = micro * accumulation
        else:
            batch = max(row_multiple, round(batch / packing_factor / row_multiple) * row_multiple)
    elif mode == "raise_betas":
        if b1 is None or b2 is None:
            raise ValueError(
                "packing_hparams='raise_betas' needs config.optimizer.b1 and b2 "
                f"(optimizer {config.optimizer.name!r} has none)."
            )
        b1, b2 = optim.adjust_betas_for_packing(b1, b2, packing_factor)
    return PackingAdjustment(packing_factor, batch, accumulation, b1, b2)


def learning_rate_schedule(schedule: ml_collections.ConfigDict, train_steps: int) -> optax.Schedule:
    """Linear warm-up from 0 to the peak, then polynomial decay to `end_learning_rate`.

    The schedule starts at step `schedule.step_offset` (0 before it) and decays over
    `schedule.total_steps` steps (0: until `train_steps`).
    """
    offset = schedule.get("step_offset", 0)
    total = schedule.get("total_steps", 0) or (train_steps - offset)
    warmup = schedule.warmup_steps
    if total <= 0 or warmup < 0 or warmup > total:
        raise ValueError(
            f"Bad schedule: warmup_steps={warmup}, total_steps={total} (step_offset={offset}); "
            "need 0 <= warmup_steps <= total_steps and total_steps > 0."
        )
    peak = schedule.learning_rate
    decay = optax.polynomial_schedule(
        init_value=peak,
        end_value=schedule.end_learning_rate,
        power=schedule.decay_power,
        transition_steps=max(total - warmup, 1),
    )
    warm = optax.linear_schedule(0.0, peak, max(warmup, 1))
    phase = optax.join_schedules([warm, decay], [warmup])
    return phase if offset == 0 else (lambda step: phase(step - offset))


def create_optimizer(
    config: ml_collections.ConfigDict, adjustment: PackingAdjustment
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """`optim.create(config.optimizer)` with the schedule, clipping and packing-adjusted betas.

    Keep the returned transformation itself for `optim.after_step` (host work, e.g. Shampoo).
    """
    schedule = learning_rate_schedule(config.schedule, config.train.steps)
    overrides = {"learning_rate": schedule}
    if adjustment.b1 is not None and "b1" in config.optimizer:
        overrides.update(b1=adjustment.b1, b2=adjustment.b2)
    if config.train.grad_clip_norm:
        overrides["grad_clip_norm"] = config.train.grad_clip_norm
    return optim.create(config.optimizer, **overrides), schedule
