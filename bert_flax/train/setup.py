"""`create_train_setup(config, task)`: exactly the configured model, mesh, sharded state and steps.

The train loop (`bert_flax.train.loop`), the profiler and the benchmarks all build their step here,
so what they measure is what trains:

    setup = create_train_setup(configs.tiny.get_config())   # task: tasks.PreTrainingTask
    batch = setup.make_batch(seed=0)                     # a global, sharded (synthetic) batch
    state, metrics = setup.train_step(setup.state, batch, setup.step_key(0))

`create_train_setup` reads top to bottom as the recipe: the task's data -> mesh -> packing
adjustment -> run length -> model -> optimizer -> state -> steps. The helpers below it are those
steps.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh

import optim
import packing
from bert_flax import sharding
from bert_flax.model import attention
from bert_flax.model import bert as bert_model
from bert_flax.model.config import BertConfig
from bert_flax.model.losses import Objective
from bert_flax.tasks import Task, task_class
from bert_flax.train import step as train_step
from bert_flax.train.step import TrainState

DTYPES = ("float32", "bfloat16")
# config.train.prng_impl -> jax's name. The dropout keys only: parameters are always initialised
# with threefry, so a run's initial weights do not depend on this choice.
PRNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}
PACKING_HPARAMS = ("none", "divide_accumulation", "raise_betas")


@dataclasses.dataclass(frozen=True)
class PackingAdjustment:
    """Hyper-parameters after adapting to the packing factor (Krell et al., 2021, Sec. 4)."""

    packing_factor: float
    batch_size: int  # rows per optimizer step
    accumulation: int
    optimizer: str  # config.optimizer.name
    hparams: dict[str, Any]  # its settings (`optim.settings_of`), the betas adjusted
    learning_rate_scale: float = 1.0  # times config.schedule's rates (train.min_rows_per_step)

    @property
    def b1(self) -> float | None:
        return self.hparams.get("b1")

    @property
    def b2(self) -> float | None:
        return self.hparams.get("b2")


@dataclasses.dataclass(frozen=True)
class RunLength:
    """How long a run trains, warms up, and how often it evaluates and saves: the config's
    fields, or derived from the data where the config asks (`run_length`). The config itself is
    never changed; the run's config.json records these apart ("resolved")."""

    steps: int
    warmup_steps: int
    eval_every_steps: int
    checkpoint_every_steps: int
    steps_per_epoch: int | None = None  # None: the task's data is not read in epochs


@dataclasses.dataclass
class TrainProgram:
    """Everything a run compiles, without any array: what `create_train_setup` materialises,
    and what `bert_flax.aot` compiles for devices it does not have. `abstract_state` holds
    `jax.ShapeDtypeStruct`s carrying `state_shardings`; `init_state(rng)` builds the state."""

    config: ml_collections.ConfigDict
    task: Task
    mesh: Mesh
    rules: list
    adjustment: PackingAdjustment
    run_length: RunLength
    model_config: BertConfig
    attention_impl: str  # the backend the model's attention runs on the mesh ("auto" resolved)
    model: nn.Module
    tx: optax.GradientTransformation
    learning_rate: optax.Schedule
    init_state: Callable[[jax.Array], TrainState]
    abstract_state: TrainState
    state_shardings: TrainState
    train_step: Callable[[TrainState, Any, jax.Array], tuple[TrainState, dict]]
    eval_step: Callable[[Any, Any], tuple[dict, dict]]  # (metrics, outputs): train_step.eval_step


@dataclasses.dataclass
class TrainSetup(TrainProgram):
    """What `create_train_setup` builds: the program and its state. `batch_size`/`accumulation`
    are after packing adjustments (`adjustment`); `train_step` is jitted with shardings and
    donates its state."""

    state: TrainState

    @property
    def batch_size(self) -> int:
        return self.adjustment.batch_size

    @property
    def accumulation(self) -> int:
        return self.adjustment.accumulation

    @property
    def num_params(self) -> int:
        return parameter_count(self.state.params)

    def loop_step(
        self, state: TrainState, batch: Any, rng: jax.Array, step: int
    ) -> tuple[TrainState, dict]:
        """One step of the training loop: the jitted train step, then the optimizer's host
        work after update number `step` (`optim.after_step`: Shampoo's asynchronous roots)."""
        state, metrics = self.train_step(state, batch, rng)
        return state.replace(opt_state=optim.after_step(self.tx, state.opt_state, step)), metrics

    @functools.cached_property
    def _dropout_base_key(self) -> jax.Array:
        return dropout_base_key(self.config.seed, self.config.train.prng_impl)

    def step_key(self, step: int) -> jax.Array:
        """The dropout key of update `step` (`dropout_key`): one fold-in per step in the loop."""
        return jax.random.fold_in(self._dropout_base_key, step)

    def make_batch(self, seed: int = 0, rows: int | None = None) -> dict[str, jax.Array]:
        """A synthetic global batch of `rows` (default: one optimizer step), sharded."""
        rows = self.batch_size if rows is None else rows
        local = self.task.synthetic_batch(
            rows // jax.process_count(), seed=seed * jax.process_count() + jax.process_index()
        )
        return sharding.global_batch(self.mesh, local)

    def first_train_batches(self, count: int) -> list[dict[str, jax.Array]]:
        """The first `count` batches of the task's training data, sharded (to time a step on
        real rows)."""
        iterator = self.task.train_batches(self.batch_size, self.model_config.vocab_size)
        return [sharding.global_batch(self.mesh, next(iterator)) for _ in range(count)]


def dropout_base_key(seed: int, prng_impl: str = "threefry") -> jax.Array:
    """The key every step's dropout key is folded from (`dropout_key`)."""
    return jax.random.fold_in(jax.random.key(seed, impl=PRNG_IMPLS[prng_impl]), 1)


def dropout_key(seed: int, step: int, prng_impl: str = "threefry") -> jax.Array:
    """The dropout key of update `step`: a function of the seed, step and generator
    (`PRNG_IMPLS`) only, so resuming repeats it."""
    return jax.random.fold_in(dropout_base_key(seed, prng_impl), step)


def create_train_setup(
    config: ml_collections.ConfigDict,
    mesh: Mesh | None = None,
    *,
    task: Task | None = None,
    packing_factor_override: float | None = None,
) -> TrainSetup:
    """Builds the model, mesh, sharded TrainState and the jitted train/eval steps of `config`.

    Args:
      config: a config as in `configs/default.py`.
      mesh: a mesh to use instead of the one `config.mesh` describes.
      task: what to train (default: the config's, `tasks.task_class(config.task)(config)`).
      packing_factor_override: the packing factor to adapt hyper-parameters to, instead of the
        one of the task's data.

    Raises:
      ValueError/FileNotFoundError: on configs that cannot run (message says what to change).
    """
    program = create_train_program(
        config, mesh, task=task, packing_factor_override=packing_factor_override
    )
    # The state, initialised directly sharded (no device ever holds a full unsharded copy).
    state = jax.jit(program.init_state, out_shardings=program.state_shardings)(
        jax.random.key(config.seed)
    )
    fields = {f.name: getattr(program, f.name) for f in dataclasses.fields(TrainProgram)}
    return TrainSetup(**fields, state=state)


def create_train_program(
    config: ml_collections.ConfigDict,
    mesh: Mesh | None = None,
    *,
    task: Task | None = None,
    packing_factor_override: float | None = None,
) -> TrainProgram:
    """`create_train_setup` up to the state: the recipe of a run (arguments as there), traced
    only, so `mesh` may hold compile-only devices (`bert_flax.aot.targets`)."""
    validate_config(config)
    # The task's data: row shape, vocabulary and packing factor.
    task = task_class(config.task)(config) if task is None else task

    # Mesh and the logical-axis rules it supports.
    mesh, rules = sharding.layout(config.mesh, mesh)

    # Packing adjustment: rows per step, micro-batches and betas for the packing factor.
    factor = task.packing_factor() if packing_factor_override is None else packing_factor_override
    adjustment = adjust_for_packing(config, factor, sharding.data_parallel_size(mesh))
    check_batch_fits(mesh, adjustment.batch_size, adjustment.accumulation, "train")
    check_batch_fits(mesh, config.eval.batch_size, 1, "eval")

    # Run length: steps, warm-up and intervals (from epochs and fractions where asked).
    length = run_length(config, task.steps_per_epoch(adjustment.batch_size))

    # An example of the task's batches, one row per data shard (kernels that run per shard in
    # `shard_map`, such as splash attention, need every shard to hold a row): the state is
    # traced from it.
    example = task.synthetic_batch(sharding.data_parallel_size(mesh), seed=0)

    # Model, and whether its kernels can run the task's rows on this mesh.
    model_config = task.model_config()
    model = task.model(model_config)
    row_length = example["input_ids"].shape[1]
    attention_impl = attention.backend_for(
        model_config.attention_impl,
        sharding.mesh_platform(mesh),
        row_length,
        model_config.attention_interpret,
    )
    attention.check_backend(attention_impl, model_config.num_heads, row_length, dict(mesh.shape))

    # Optimizer (layer by layer over the stacked parameters of scanned layers).
    tx, schedule = create_optimizer(
        config, adjustment, length, scanned_layers=model_config.scan_layers
    )

    # State.
    init_state, state_shardings = sharded_state_init(
        model, example, tx, mesh, rules, jax.random.key(config.seed)
    )
    abstract_state = sharding.abstract_arrays(
        jax.eval_shape(init_state, jax.random.key(config.seed)), state_shardings
    )

    # Steps: the pure functions of `train_step`, bound and jitted with shardings.
    jitted_train_step, jitted_eval_step = jit_steps(
        model, tx, schedule, task.objective, adjustment.accumulation, mesh, rules, state_shardings
    )
    return TrainProgram(
        config=config,
        task=task,
        mesh=mesh,
        rules=rules,
        adjustment=adjustment,
        run_length=length,
        model_config=model_config,
        attention_impl=attention_impl,
        model=model,
        tx=tx,
        learning_rate=schedule,
        init_state=init_state,
        abstract_state=abstract_state,
        state_shardings=state_shardings,
        train_step=jitted_train_step,
        eval_step=jitted_eval_step,
    )


def jit_steps(
    model: nn.Module,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    objective: Objective,
    accumulation: int,
    mesh: Mesh,
    rules: sharding.Rules,
    state_shardings: Any,
) -> tuple[Callable, Callable]:
    """`train_step.train_step` and `eval_step` bound to the run's model, optimizer and
    objective, jitted with its shardings (the train step donates the state)."""
    batch, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    train = sharding.jit_partitioned(
        functools.partial(
            train_step.train_step,
            model=model,
            tx=tx,
            learning_rate=schedule,
            objective=objective,
            accumulation=accumulation,
        ),
        mesh,
        rules,
        in_shardings=(state_shardings, batch, replicated),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,),
    )
    evaluate = sharding.jit_partitioned(
        functools.partial(train_step.eval_step, model=model, objective=objective),
        mesh,
        rules,
        in_shardings=(None, batch),
        out_shardings=replicated,
    )
    return train, evaluate


def parameter_count(params: Any) -> int:
    """The number of parameters in `params` (arrays or abstract ones)."""
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))


# -- Config --------------------------------------------------------------------------------------


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Fails early, with what to change, on configs that cannot run (before reading any data)."""
    data, train = config.data, config.train
    if train.dtype not in DTYPES:
        raise ValueError(f"config.train.dtype={train.dtype!r} is not one of {DTYPES}.")
    if train.prng_impl not in PRNG_IMPLS:
        raise ValueError(
            f"config.train.prng_impl={train.prng_impl!r} is not one of {list(PRNG_IMPLS)}."
        )
    if train.steps <= 0 and train.epochs <= 0:
        raise ValueError(
            f"config.train.steps={train.steps} must be positive (or config.train.epochs set)."
        )
    if not 0.0 <= config.schedule.warmup_fraction <= 1.0:
        raise ValueError(
            f"config.schedule.warmup_fraction={config.schedule.warmup_fraction} is not in [0, 1]."
        )
    if train.min_rows_per_step < 1:
        raise ValueError(f"config.train.min_rows_per_step={train.min_rows_per_step} must be >= 1.")
    if data.max_sequences_per_pack < 1:
        raise ValueError("config.data.max_sequences_per_pack must be >= 1.")
    if data.algorithm not in packing.ALGORITHMS:
        raise ValueError(
            f"config.data.algorithm={data.algorithm!r} is not one of {packing.ALGORITHMS}."
        )
    for section in ("eval", "log"):
        if config[section].every_steps <= 0:
            raise ValueError(
                f"config.{section}.every_steps={config[section].every_steps} must be positive."
            )
    if config.checkpoint.every_steps < 0:
        raise ValueError(
            f"config.checkpoint.every_steps={config.checkpoint.every_steps} must be >= 0 (0: at "
            "every evaluation)."
        )


def run_length(config: ml_collections.ConfigDict, steps_per_epoch: int | None) -> RunLength:
    """The run's `RunLength` for the task's `steps_per_epoch` (after the packing adjustment;
    None: data not read in epochs). Steps: `train.epochs` epochs, at least `train.min_steps`
    (epochs > 0), else `train.steps`; warm-up: `schedule.warmup_fraction` of the steps (> 0),
    else `schedule.warmup_steps`; evaluations: `eval.evaluations` evenly over the run (> 0),
    else one an epoch (epochs > 0), else every `eval.every_steps`; checkpoints: every
    `checkpoint.every_steps` (0: at every evaluation)."""
    train, epochs = config.train, config.train.epochs
    if epochs > 0:
        if steps_per_epoch is None:
            raise ValueError(
                f"config.train.epochs={epochs}: config.task={config.task!r} does not read its "
                "data in epochs; set config.train.steps and leave config.train.epochs at 0."
            )
        if steps_per_epoch == 0:
            raise ValueError(
                "The train split makes fewer rows than one step's batch; lower "
                "config.train.batch_size."
            )
        steps = max(math.ceil(epochs * steps_per_epoch), train.min_steps)
    else:
        steps = train.steps
    fraction = config.schedule.warmup_fraction
    warmup = round(fraction * steps) if fraction else config.schedule.warmup_steps
    evaluations = config.eval.evaluations
    if evaluations > 0:
        eval_every = math.ceil(steps / evaluations)
    else:
        eval_every = steps_per_epoch if epochs > 0 else config.eval.every_steps
    return RunLength(
        steps=steps,
        warmup_steps=warmup,
        eval_every_steps=eval_every,
        checkpoint_every_steps=config.checkpoint.every_steps or eval_every,
        steps_per_epoch=steps_per_epoch,
    )


def adjust_for_packing(
    config: ml_collections.ConfigDict, packing_factor: float, row_multiple: int = 1
) -> PackingAdjustment:
    """Applies `config.train.packing_hparams` for rows holding `packing_factor` sequences.

    "divide_accumulation": about p times fewer rows per step, so a step still sees about as many
    sequences as unpacked: the number of micro-batches is divided by p (or, without accumulation,
    the batch, rounded to a multiple of `row_multiple`, the data-parallel size). Where that
    leaves fewer rows than `train.min_rows_per_step`, the step takes that many rows, r times the
    sequences, and Adam's square-root scaling rule (Malladi et al., 2022) keeps the learning per
    sequence: betas to the power r, learning rate times sqrt(r) (the steps, from the epochs, are
    r times fewer). "raise_betas": same rows, p times more sequences per step, and the betas
    raised to the power p.
    """
    mode = config.train.packing_hparams
    if mode not in PACKING_HPARAMS:
        raise ValueError(f"config.train.packing_hparams={mode!r} is not one of {PACKING_HPARAMS}.")
    if packing_factor < 1.0:
        raise ValueError(f"packing factor {packing_factor} < 1: rows hold at least one sequence.")
    batch, accumulation = config.train.batch_size, config.train.accumulation
    name, hparams = optim.settings_of(config.optimizer)
    b1, b2 = hparams.get("b1"), hparams.get("b2")
    scale = 1.0  # sequences per step over the unpacked step's, beyond what packing divides
    if mode == "divide_accumulation":
        micro = batch // accumulation
        if accumulation > 1:
            divided = max(1, round(accumulation / packing_factor))
            floor = -(-config.train.min_rows_per_step // micro)
            accumulation = min(max(divided, floor), accumulation)
            scale, batch = accumulation / divided, micro * accumulation
        else:
            divided = max(row_multiple, round(batch / packing_factor / row_multiple) * row_multiple)
            floor = -(-config.train.min_rows_per_step // row_multiple) * row_multiple
            batch = min(max(divided, floor), batch)
            scale = batch / divided
        if scale > 1.0 and b1 is not None and b2 is not None:
            b1, b2 = optim.adjust_betas_for_packing(b1, b2, scale)
    elif mode == "raise_betas":
        if b1 is None or b2 is None:
            with_betas = [
                k for k in optim.OPTIMIZERS if {"b1", "b2"} <= set(optim.hyperparameters(k))
            ]
            raise ValueError(
                f"packing_hparams='raise_betas' raises the betas b1, b2, but optimizer {name!r} "
                f"has none; use divide_accumulation, or an optimizer with betas: {with_betas}."
            )
        b1, b2 = optim.adjust_betas_for_packing(b1, b2, packing_factor)
    if b1 is not None and b2 is not None:
        hparams = {**hparams, "b1": b1, "b2": b2}
    return PackingAdjustment(packing_factor, batch, accumulation, name, hparams, math.sqrt(scale))


def check_batch_fits(mesh: Mesh, global_rows: int, accumulation: int, what: str = "batch") -> int:
    """Checks that every micro-batch splits evenly over data shards and hosts; returns its rows."""
    if global_rows <= 0 or accumulation <= 0:
        raise ValueError(f"{what}: batch_size {global_rows} and accumulation {accumulation} > 0.")
    if global_rows % accumulation:
        raise ValueError(
            f"{what}: batch_size {global_rows} is not divisible by accumulation {accumulation}."
        )
    micro = global_rows // accumulation
    shards = sharding.data_parallel_size(mesh)
    if micro % shards:
        raise ValueError(
            f"{what}: the micro-batch of {micro} rows (batch_size {global_rows} / accumulation "
            f"{accumulation}) is not divisible by the {shards} data-parallel shards of mesh "
            f"{dict(mesh.shape)}; make batch_size a multiple of {shards * accumulation}."
        )
    if global_rows % jax.process_count():
        raise ValueError(
            f"{what}: batch_size {global_rows} is not divisible by {jax.process_count()} processes."
        )
    return micro


# -- Optimizer -----------------------------------------------------------------------------------


def learning_rate_schedule(
    schedule: ml_collections.ConfigDict, train_steps: int, warmup_steps: int, scale: float = 1.0
) -> optax.Schedule:
    """Linear warm-up from 0 to the peak over `warmup_steps` (the run's: `RunLength`), then
    polynomial decay to `end_learning_rate` (both rates times `scale`).

    The schedule starts at step `schedule.step_offset` (0 before it) and decays over
    `schedule.total_steps` steps (0: until `train_steps`).
    """
    offset = schedule.step_offset
    total = schedule.total_steps or (train_steps - offset)
    warmup = warmup_steps
    if total <= 0 or warmup < 0 or warmup > total:
        raise ValueError(
            f"Bad schedule: warmup_steps={warmup}, total_steps={total} (step_offset={offset}); "
            "need 0 <= warmup_steps <= total_steps and total_steps > 0."
        )
    peak = schedule.learning_rate * scale
    decay = optax.polynomial_schedule(
        init_value=peak,
        end_value=schedule.end_learning_rate * scale,
        power=schedule.decay_power,
        transition_steps=max(total - warmup, 1),
    )
    warm = optax.linear_schedule(0.0, peak, max(warmup, 1))
    phase = optax.join_schedules([warm, decay], [warmup])
    return phase if offset == 0 else (lambda step: phase(step - offset))


def create_optimizer(
    config: ml_collections.ConfigDict,
    adjustment: PackingAdjustment,
    length: RunLength,
    scanned_layers: bool = False,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer of `adjustment` (config.optimizer with packing-adjusted betas) with the
    schedule over `length` and clipping;
    `scanned_layers`: the model's layers are stacked (`BertConfig.scan_layers`), and the
    optimizer updates them layer by layer (`optim.layerwise`).

    Keep the returned transformation itself for `optim.after_step` (host work, e.g. Shampoo).
    """
    schedule = learning_rate_schedule(
        config.schedule, length.steps, length.warmup_steps, adjustment.learning_rate_scale
    )
    overrides = {**adjustment.hparams, "learning_rate": schedule}
    if config.train.grad_clip_norm:
        overrides["grad_clip_norm"] = config.train.grad_clip_norm
    if scanned_layers:
        overrides["layerwise"] = lambda names: names[:2] == ["bert", bert_model.SCANNED_LAYERS[0]]
    return optim.create(adjustment.optimizer, **overrides), schedule


# -- State ---------------------------------------------------------------------------------------


def sharded_state_init(
    model: nn.Module,
    example: dict[str, Any],
    tx: optax.GradientTransformation,
    mesh: Mesh,
    rules: sharding.Rules,
    rng: jax.Array,
) -> tuple[Callable[[jax.Array], TrainState], TrainState]:
    """`init_state(rng)`, a TrainState's initialisation, and the tree of its shardings.

    The initialisation is traced with `jax.eval_shape` (no memory) to derive every leaf's
    sharding; run it under `jax.jit(init_state, out_shardings=...)` so that no device ever
    holds a full unsharded copy.
    """
    example = jax.tree_util.tree_map(jnp.asarray, example)

    def init_params(rng: jax.Array) -> Any:
        return model.init(rng, example, deterministic=True)["params"]

    def init_state(rng: jax.Array) -> TrainState:
        with sharding.partitioning(mesh, rules):
            params = sharding.unbox(init_params(rng))
        return TrainState.create(params, tx)

    with sharding.partitioning(mesh, rules):
        boxed = jax.eval_shape(init_params, rng)
    return init_state, sharding.state_shardings(jax.eval_shape(init_state, rng), boxed, mesh, rules)
