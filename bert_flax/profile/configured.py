"""Profile the training step a config describes, exactly as `bert_flax.train` builds it.

    result = profile_config(configs.tiny.get_config(), steps=3)

The step comes from `bert_flax.train_setup.create_train_setup` (model, row shape,
optimizer, dtype, accumulation, mesh); the batch is a synthetic one of the configured shapes,
since the profile measures the compiled step, not the input pipeline.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from bert_flax.profile import ceilings as ceilings_lib
from bert_flax.profile.profiler import StepProfile, profile_step

# Short names for the settings people sweep most; any dotted config key works too.
SWEEP_ALIASES = {
    "seq_len": "data.max_seq_length",
    "dtype": "train.dtype",
    "optimizer": "optimizer.name",
    "packed": "data.packed",
    "batch_size": "train.batch_size",
    "accumulation": "train.accumulation",
    "preset": "model.preset",
    "layers": "model.overrides.num_layers",
    "attention": "model.overrides.attention_impl",
}


def _parse_value(text: str, current: Any) -> Any:
    if isinstance(current, bool):
        lowered = text.lower()
        if lowered not in ("true", "false", "1", "0"):
            raise ValueError(f"expected a boolean (true/false), got {text!r}")
        return lowered in ("true", "1")
    if isinstance(current, int):
        return int(text)
    if isinstance(current, float):
        return float(text)
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def set_config_value(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    """`config.<key> = text`, parsed to the field's type; `key` may be a sweep alias."""
    path = SWEEP_ALIASES.get(key, key).split(".")
    node = config
    for part in path[:-1]:
        if part not in node:
            raise KeyError(f"config has no section {part!r} (setting {key!r})")
        node = node[part]
    leaf = path[-1]
    if leaf not in node and path[:-1] != ["model", "overrides"]:
        raise KeyError(f"config has no field {'.'.join(path)!r}; aliases: {sorted(SWEEP_ALIASES)}")
    current = node[leaf] if leaf in node else None
    with node.unlocked():
        node[leaf] = _parse_value(text, current)


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
    config = ml_collections.ConfigDict(config.to_dict())
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
    from bert_flax.train_setup import create_train_setup

    config = ml_collections.ConfigDict(config.to_dict())
    if not config.data.data_dir:
        config.data.synthetic = True
    setup = create_train_setup(config)
    batch = setup.make_batch(seed=0)
    result = profile_step(
        setup.train_step,
        setup.state,
        batch,
        jax.random.key(1),
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
