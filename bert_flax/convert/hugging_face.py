"""Hugging Face BERT <-> bert_flax: configs, state dicts and directories (`config.json` +
`model.safetensors` or `pytorch_model.bin`), through the name table (`tables.py`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from bert_flax.convert.tables import (
    Param,
    Params,
    check_has_layout,
    check_shape,
    expected_shapes,
    flatten,
    param_table,
    unflatten,
)
from bert_flax.model.bert import stack_layers, unstack_layers
from bert_flax.model.config import BertConfig

# HF `hidden_act` -> ours. HF "gelu" is the exact erf GELU; "gelu_new" the tanh approximation.
_HF_ACTS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
_TO_HF_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


# ---------------------------------------------------------------------------------------------
# Configs.


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> BertConfig:
    """BertConfig from a Hugging Face `config.json` dict."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"position_embedding_type={hf['position_embedding_type']!r}: only absolute "
            "position embeddings are supported."
        )
    act = hf.get("hidden_act", "gelu")
    if act not in _HF_ACTS:
        raise ValueError(f"hidden_act={act!r} is not supported; known: {sorted(_HF_ACTS)}.")
    fields = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        hidden_dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        hidden_act=_HF_ACTS[act],
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        initializer_range=hf.get("initializer_range", 0.02),
    )
    fields.update(overrides)
    return BertConfig(**fields)


def config_to_hf(config: BertConfig) -> dict[str, Any]:
    """Hugging Face `config.json` dict for a BertConfig (post-LN models only)."""
    check_has_layout(config)
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": _TO_HF_ACTS[config.hidden_act],
        "hidden_dropout_prob": config.hidden_dropout_rate,
        "attention_probs_dropout_prob": config.attention_dropout_rate,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
    }


# ---------------------------------------------------------------------------------------------
# Hugging Face.


# Tied copies HF keeps in `state_dict()`; checked for equality on import, re-created on export.
_HF_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# Non-parameter buffers HF may store.
_HF_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")


def _normalise_hf_name(name: str) -> str:
    """Old BERT checkpoints (e.g. the original bert-base-uncased .bin) name LayerNorm params
    gamma/beta; HF renames them on load, so do we."""
    if ".LayerNorm." in name:
        name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight")
        name = name.replace(".LayerNorm.beta", ".LayerNorm.bias")
    return name


def _qa_param_table(config: BertConfig) -> Iterator[Param]:
    """`BertForQuestionAnswering`'s parameters: the encoder (no pooler) and `qa_outputs`."""
    yield from (p for p in param_table(config) if p.ours.startswith("bert/"))
    yield Param("qa_outputs/kernel", "qa_outputs.weight", "", True, False)
    yield Param("qa_outputs/bias", "qa_outputs.bias", "", False, False)


def qa_expected_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """The shapes of `tasks.squad.model.BertForQuestionAnswering(config)`'s parameters: the
    encoder's, and a start and an end logit a token."""
    shapes = {k: v for k, v in expected_shapes(config).items() if k.startswith("bert/")}
    return shapes | {"qa_outputs/kernel": (config.hidden_size, 2), "qa_outputs/bias": (2,)}


def from_hf_state_dict(
    state_dict: Mapping[str, Any], config: BertConfig, *, question_answering: bool = False
) -> Params:
    """HF `BertForPreTraining` (or, `question_answering`, `BertForQuestionAnswering`) state dict
    (torch tensors or numpy arrays) -> our `params` (layers stacked where `config.scan_layers`)."""
    check_has_layout(config)
    if config.scan_layers:
        flat_config = config.replace(scan_layers=False)
        return stack_layers(from_hf_state_dict(state_dict, flat_config,
                                               question_answering=question_answering))  # fmt: skip
    arrays = {_normalise_hf_name(k): _to_numpy(v) for k, v in state_dict.items()}
    if question_answering:
        table, expected, model = _qa_param_table, qa_expected_shapes(config), "ForQuestionAnswering"
    else:
        table, expected, model = param_table, expected_shapes(config), "ForPreTraining"
    flat, used = {}, set()
    for p in table(config):
        if p.hf not in arrays:
            raise KeyError(
                f"HF checkpoint lacks {p.hf!r} (needed for {p.ours}); a Bert{model} checkpoint "
                "is required (BertModel-only checkpoints have no heads)."
            )
        value = arrays[p.hf].T if p.hf_transposed else arrays[p.hf]
        check_shape(p.hf, value, expected[p.ours])
        flat[p.ours] = np.ascontiguousarray(value, dtype=np.float32)
        used.add(p.hf)
    for tied, source in _HF_TIED.items():
        if tied in arrays:
            if not np.array_equal(arrays[tied], arrays[source]):
                raise ValueError(
                    f"{tied} differs from {source}: only tied MLM decoders are supported."
                )
            used.add(tied)
    unknown = set(arrays) - used - set(_HF_BUFFERS)
    if unknown:
        raise ValueError(f"Unexpected HF parameters (not converted): {sorted(unknown)}.")
    return unflatten(flat)


def to_hf_state_dict(
    params: Params, config: BertConfig, *, question_answering: bool = False
) -> dict[str, np.ndarray]:
    """Our `params` -> HF `BertForPreTraining` (including the tied copies) or, with
    `question_answering`, `BertForQuestionAnswering` state dict (numpy)."""
    check_has_layout(config)
    config = config.replace(scan_layers=False)
    flat = flatten(unstack_layers(params))
    out = {}
    for p in (_qa_param_table if question_answering else param_table)(config):
        value = flat.pop(p.ours)
        out[p.hf] = np.ascontiguousarray(value.T if p.hf_transposed else value)
    if flat:
        raise ValueError(f"Parameters without an HF name: {sorted(flat)}.")
    if not question_answering:
        for tied, source in _HF_TIED.items():
            out[tied] = out[source]
    return out


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor
        return value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)


def _read_hf_weights(directory: str) -> dict[str, Any]:
    """Reads model.safetensors / pytorch_model.bin (or their sharded `*.index.json` forms)."""
    for name, reader in (
        ("model.safetensors", _read_safetensors),
        ("pytorch_model.bin", _read_torch),
    ):
        single = os.path.join(directory, name)
        if os.path.exists(single):
            return reader(single)
        index = single + ".index.json"
        if os.path.exists(index):
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            weights = {}
            for shard in shards:
                weights.update(reader(os.path.join(directory, shard)))
            return weights
    raise FileNotFoundError(
        f"No model.safetensors or pytorch_model.bin (or sharded index) in {directory!r}; "
        f"found {sorted(os.listdir(directory))}."
    )


def _read_safetensors(path: str) -> dict[str, Any]:
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except TypeError:  # bfloat16 tensors have no numpy dtype; torch reads them.
        from safetensors.torch import load_file as load_torch

        return load_torch(path)


def _read_torch(path: str) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def read_hf_config(directory: str, **config_overrides: Any) -> BertConfig:
    """The BertConfig of a HF BertForPreTraining directory (its config.json)."""
    with open(os.path.join(directory, "config.json")) as f:
        return config_from_hf(json.load(f), **config_overrides)


def load_hf_checkpoint(directory: str, **config_overrides: Any) -> tuple[BertConfig, Params]:
    """Reads a HF BertForPreTraining directory -> (BertConfig, params)."""
    config = read_hf_config(directory, **config_overrides)
    return config, from_hf_state_dict(_read_hf_weights(directory), config)


def save_hf_checkpoint(params: Params, config: BertConfig, directory: str) -> None:
    """Writes config.json + model.safetensors (tied copies left out, as `save_pretrained` does)."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    state = to_hf_state_dict(params, config)
    for tied in _HF_TIED:
        del state[tied]
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config_to_hf(config), f, indent=2)
