"""`create_train_setup(config)`: exactly the configured model, mesh, sharded state and step.

The train loop (`bert_flax.train`), the profiler and the benchmarks all build their step here,
so what they measure is what trains:

    setup = create_train_setup(configs.tiny.get_config())
    batch = setup.make_batch(seed=0)                     # a global, sharded (synthetic) batch
    state, metrics = setup.train_step(setup.state, batch, jax.random.key(1))
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from bert_flax import mesh as mesh_lib
from bert_flax import sharding, synthetic_batches
from bert_flax.config import BertConfig
from bert_flax.model import BertForPreTraining
from bert_flax.optimizer_setup import PackingAdjustment, adjust_for_packing, create_optimizer
from bert_flax.train_state import TrainState, count_params, create_sharded_state
from bert_flax.train_step import jit_train_step, make_eval_step, make_train_step

DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class BatchGeometry:
    """Fixed shapes of a batch: row length L, sequences per row D, predictions per row P."""

    max_seq_length: int
    max_sequences_per_pack: int
    max_predictions: int


@dataclasses.dataclass
class TrainSetup:
    """What `create_train_setup` builds. `batch_size`/`accumulation` are after packing
    adjustments (`adjustment`); `train_step` is jitted with shardings and donates its state."""

    config: ml_collections.ConfigDict
    model_config: BertConfig
    model: BertForPreTraining
    mesh: Mesh
    rules: list
    tx: optax.GradientTransformation
    learning_rate: optax.Schedule
    adjustment: PackingAdjustment
    geometry: BatchGeometry
    state: TrainState
    state_shardings: TrainState
    train_step: Callable[[TrainState, Any, jax.Array], tuple[TrainState, dict]]
    eval_step: Callable[[Any, Any], dict]

    @property
    def batch_size(self) -> int:
        return self.adjustment.batch_size

    @property
    def accumulation(self) -> int:
        return self.adjustment.accumulation

    @property
    def num_params(self) -> int:
        return count_params(self.state.params)

    def make_batch(self, seed: int = 0, rows: int | None = None) -> dict[str, jax.Array]:
        """A synthetic global batch of `rows` (default: one optimizer step), sharded."""
        rows = self.batch_size if rows is None else rows
        local_rows = rows // jax.process_count()
        local = synthetic_batches.random_batch(
            local_rows,
            max_seq_length=self.geometry.max_seq_length,
            max_sequences_per_pack=self.geometry.max_sequences_per_pack,
            max_predictions=self.geometry.max_predictions,
            vocab_size=self.model_config.vocab_size,
            seed=seed * jax.process_count() + jax.process_index(),
        )
        return mesh_lib.global_batch(self.mesh, local)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Fails early, with what to change, on configs that cannot run."""
    data, train = config.data, config.train
    if not data.synthetic:
        if not data.data_dir:
            raise ValueError(
                "config.data.data_dir is empty: prepare data with `python -m "
                "bert_flax.data.create_pretraining_data --output_dir=DIR ...` and pass "
                "--config.data.data_dir=DIR (or --config.data.synthetic=True for random batches)."
            )
        summary = os.path.join(data.data_dir, "summary.json")
        if not os.path.exists(summary):
            raise FileNotFoundError(
                f"{summary} not found: {data.data_dir!r} is not a directory prepared by "
                "bert_flax.data.create_pretraining_data."
            )
        prepared_length = _summary(data.data_dir)["options"]["max_seq_length"]
        if prepared_length != data.max_seq_length:
            raise ValueError(
                f"config.data.max_seq_length={data.max_seq_length} but {data.data_dir} was "
                f"prepared with max_seq_length={prepared_length}."
            )
    if train.dtype not in DTYPES:
        raise ValueError(f"config.train.dtype={train.dtype!r} is not one of {DTYPES}.")
    if train.steps <= 0:
        raise ValueError(f"config.train.steps={train.steps} must be positive.")
    if data.max_sequences_per_pack < 1:
        raise ValueError("config.data.max_sequences_per_pack must be >= 1.")
    for section in ("checkpoint", "eval", "log"):
        if config[section].every_steps <= 0:
            raise ValueError(
                f"config.{section}.every_steps={config[section].every_steps} must be positive."
            )


def batch_geometry(config: ml_collections.ConfigDict) -> BatchGeometry:
    """Row shapes: padded rows hold one sequence and its predictions; packed rows up to D
    sequences and the bound on masked positions the data pipeline derives (the same for real and
    synthetic batches)."""
    data = config.data
    length, per_seq, prob = data.max_seq_length, data.max_predictions_per_seq, 0.15
    if not data.synthetic:
        options = _summary(data.data_dir)["options"]
        per_seq, prob = options["max_predictions_per_seq"], options["masked_lm_prob"]
    if not data.packed:
        return BatchGeometry(length, 1, per_seq)
    depth = data.max_sequences_per_pack
    return BatchGeometry(length, depth, max_predictions_per_pack(length, depth, prob, per_seq))


def max_predictions_per_pack(
    max_seq_length: int, max_sequences: int, masked_lm_prob: float, max_predictions_per_seq: int
) -> int:
    """`bert_flax.data.pipeline.derived_max_predictions` (a test keeps them equal), without
    importing TensorFlow: a sequence of length l has at most l * p + 1 predictions."""
    bound = int(np.floor(masked_lm_prob * max_seq_length + 1e-9)) + max_sequences
    return int(min(max_sequences * max_predictions_per_seq, bound))


def _summary(data_dir: str) -> dict:
    with open(os.path.join(data_dir, "summary.json")) as f:
        return json.load(f)


def packing_factor(config: ml_collections.ConfigDict) -> float:
    """Mean sequences per row: 1 unpacked, else from the data's strategies (or, for synthetic
    batches, from the random row generator)."""
    data = config.data
    if not data.packed:
        return 1.0
    if data.synthetic:
        rows = synthetic_batches.random_row_lengths(
            256, data.max_seq_length, data.max_sequences_per_pack, seed=config.seed
        )
        return float(np.mean([len(r) for r in rows]))
    import packing

    path = os.path.join(data.data_dir, "strategies.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found; rerun bert_flax.data.create_pretraining_data (it writes it)."
        )
    return float(packing.StrategySet.load(path).metrics().packing_factor)


def model_config_from(config: ml_collections.ConfigDict) -> BertConfig:
    """The preset with `config.model.overrides`, the compute dtype, and (unless overridden) the
    vocabulary size of the prepared data."""
    overrides = dict(config.model.overrides.to_dict()) if config.model.overrides else {}
    overrides["dtype"] = config.train.dtype
    if not config.data.synthetic and "vocab_size" not in overrides:
        overrides["vocab_size"] = _summary(config.data.data_dir)["vocab"]["size"]
    return BertConfig.preset(config.model.preset, **overrides)


def create_train_setup(
    config: ml_collections.ConfigDict,
    mesh: Mesh | None = None,
    *,
    packing_factor_override: float | None = None,
) -> TrainSetup:
    """Builds model, mesh, sharded TrainState and the jitted train/eval steps from `config`.

    Args:
      config: a config as in `configs/default.py`.
      mesh: a mesh to use instead of the one `config.mesh` describes.
      packing_factor_override: the packing factor to adapt hyper-parameters to, instead of the
        one of the data's strategies.

    Raises:
      ValueError/FileNotFoundError: on configs that cannot run (message says what to change).
    """
    validate_config(config)
    mesh = mesh_lib.create_mesh(config.mesh) if mesh is None else mesh
    p = packing_factor(config) if packing_factor_override is None else packing_factor_override
    adjustment = adjust_for_packing(config, p, mesh_lib.data_parallel_size(mesh))
    mesh_lib.check_batch_fits(mesh, adjustment.batch_size, adjustment.accumulation, "train")
    mesh_lib.check_batch_fits(mesh, config.eval.batch_size, 1, "eval")

    model_config = model_config_from(config)
    if not config.data.synthetic:
        data_vocab = _summary(config.data.data_dir)["vocab"]["size"]
        if model_config.vocab_size < data_vocab:
            raise ValueError(
                f"The model's vocab_size={model_config.vocab_size} is smaller than the "
                f"vocabulary of {config.data.data_dir} ({data_vocab} ids): out-of-range ids "
                "would embed as NaN. Drop config.model.overrides.vocab_size or raise it."
            )
    geometry = batch_geometry(config)
    if geometry.max_seq_length > model_config.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={geometry.max_seq_length} exceeds the model's "
            f"max_position_embeddings={model_config.max_position_embeddings}."
        )
    model = BertForPreTraining(model_config)
    rules = mesh_lib.rules_for_mesh(sharding.LOGICAL_AXIS_RULES, mesh)
    tx, schedule = create_optimizer(config, adjustment)

    example = synthetic_batches.random_batch(
        1,
        max_seq_length=geometry.max_seq_length,
        max_sequences_per_pack=geometry.max_sequences_per_pack,
        max_predictions=geometry.max_predictions,
        vocab_size=model_config.vocab_size,
    )
    example = jax.tree_util.tree_map(jnp.asarray, example)

    def init_params(rng: jax.Array) -> Any:
        return model.init(rng, example, deterministic=True)["params"]

    rng = jax.random.key(config.seed)
    state, state_shardings = create_sharded_state(init_params, tx, mesh, rules, rng)
    step = make_train_step(
        model,
        tx,
        schedule,
        mesh,
        rules,
        accumulation=adjustment.accumulation,
        mlm_normalization=config.train.mlm_normalization,
    )
    return TrainSetup(
        config=config,
        model_config=model_config,
        model=model,
        mesh=mesh,
        rules=rules,
        tx=tx,
        learning_rate=schedule,
        adjustment=adjustment,
        geometry=geometry,
        state=state,
        state_shardings=state_shardings,
        train_step=jit_train_step(step, state_shardings, mesh),
        eval_step=make_eval_step(
            model, mesh, rules, mlm_normalization=config.train.mlm_normalization
        ),
    )
