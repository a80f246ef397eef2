"""Profile the training step a config describes, exactly as `bert_flax.train.loop` builds it.

    result = profile_config(configs.tiny.get_config(), steps=3)

The step comes from `bert_flax.train.setup.create_train_setup` (model, row shape,
optimizer, dtype, accumulation, mesh); the batch is a synthetic one of the configured shapes,
since the profile measures the compiled step, not the input pipeline.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence

import jax
import ml_collections

from bert_flax.profile import ceilings as ceilings_lib
from bert_flax.profile.profiler import StepProfile, profile_step
from bert_flax.train import overrides

# Short names for the settings people sweep most; any dotted config key works too.
SWEEP_ALIASES = {
    "seq_len": "data.max_seq_length",
    "dtype": "train.dtype",
    "optimizer": "optimizer.name",
    "packed": "data.packed",
    "batch_size": "train.batch_size",
    "accumulation": "train.accumulation",
    "preset": "model.preset",
    "layers": "model.num_layers",
    "attention": "model.attention_impl",
}


def set_config_value(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    """`config.<key> = text` with the command line's parsing (`bert_flax.train.overrides`);
    `key` may be a sweep alias."""
    overrides.set_value(config, SWEEP_ALIASES.get(key, key), text)


def parse_sweeps(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """["seq_len=128,512", "dtype=float32,bfloat16"] -> [(key, values), ...]."""
    out = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key or not values:
            raise ValueError(f"--sweep {spec!r}: expected key=v1,v2,... (e.g. seq_len=128,512)")
        out.append((key.strip(), [v.strip() for v in values.split(",") if v.strip()]))
    return out


def sweep_settings(sweeps: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    """The cartesian product of the sweeps, one dict of key -> value per setting."""
    if not sweeps:
        return [{}]
    keys = [k for k, _ in sweeps]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in sweeps))]


def with_settings(config: ml_collections.ConfigDict, settings: dict[str, str]):
    config = copy.deepcopy(config)
    for key, value in settings.items():
        set_config_value(config, key, value)
    return config


def profile_config(
    config: ml_collections.ConfigDict,
    *,
    steps: int = 3,
    warmup: int = 2,
    label: str = "",
    ceilings: ceilings_lib.Ceilings | bool = True,
    logdir: str | None = None,
) -> StepProfile:
    """Build the configured train step and profile it (synthetic batch if no data_dir)."""
    from bert_flax.train.setup import create_train_setup

    config = copy.deepcopy(config)
    if not config.data.data_dir:
        config.data.synthetic = True
    setup = create_train_setup(config)
    batch = setup.make_batch(seed=0)
    result = profile_step(
        setup.train_step,
        setup.state,
        batch,
        setup.step_key(0),
        steps=steps,
        warmup=warmup,
        update=lambda args, out: (out[0], *args[1:]),
        vocab_size=setup.model_config.vocab_size,
        ceilings=ceilings,
        matmul_dtype=config.train.dtype,
        label=label,
        logdir=logdir,
    )
    result.settings = {
        "preset": config.model.preset,
        "num_layers": setup.model_config.num_layers,
        "hidden_size": setup.model_config.hidden_size,
        "seq_len": config.data.max_seq_length,
        "packed": bool(config.data.packed),
        "batch_size": setup.batch_size,
        "accumulation": setup.accumulation,
        "dtype": config.train.dtype,
        "optimizer": config.optimizer.name,
        "sequences": float(jax.device_get(batch["sequence_mask"]).sum()),
    }
    return result
