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


# The Hugging Face classes converted, each as its layers beyond the encoder: (our name, HF name,
# output width: "hidden", "labels" or a number). `BertForPreTraining` is the whole `param_table`.
PRETRAINING = "BertForPreTraining"
HF_HEADS: dict[str, tuple[tuple[str, str, str | int], ...]] = {
    "BertModel": (("nsp_head/pooler", "bert.pooler.dense", "hidden"),),
    "BertForSequenceClassification": (
        ("head/pooler", "bert.pooler.dense", "hidden"),
        ("head/classifier", "classifier", "labels"),
    ),
    "BertForQuestionAnswering": (("qa_outputs", "qa_outputs", 2),),
    "BertForTokenClassification": (("classifier", "classifier", "labels"),),
}
HF_CLASSES = (PRETRAINING, *HF_HEADS)
_POOLER = ("bert.pooler.dense.weight", "bert.pooler.dense.bias")  # a BertModel may lack it


def _check_class(hf_class: str) -> None:
    if hf_class not in HF_CLASSES:
        raise ValueError(f"{hf_class!r} is not a converted class; known: {list(HF_CLASSES)}.")


def hf_param_table(config: BertConfig, hf_class: str = PRETRAINING) -> Iterator[Param]:
    """The parameters of the Hugging Face class `hf_class` (of `HF_CLASSES`) under our and HF's
    names: the encoder and the class's layers."""
    _check_class(hf_class)
    if hf_class == PRETRAINING:
        yield from param_table(config)
        return
    yield from (p for p in param_table(config) if p.ours.startswith("bert/"))
    for ours, hf, _ in HF_HEADS[hf_class]:
        yield Param(f"{ours}/kernel", f"{hf}.weight", "", True, False)
        yield Param(f"{ours}/bias", f"{hf}.bias", "", False, False)


def hf_expected_shapes(
    config: BertConfig, hf_class: str = PRETRAINING, num_labels: int = 2
) -> dict[str, tuple[int, ...]]:
    """{"bert/layer_0/...": shape} of our parameters of `hf_class` with `num_labels` labels."""
    _check_class(hf_class)
    shapes = expected_shapes(config)
    if hf_class == PRETRAINING:
        return shapes
    shapes = {k: v for k, v in shapes.items() if k.startswith("bert/")}
    widths = {"hidden": config.hidden_size, "labels": num_labels}
    for ours, _, width in HF_HEADS[hf_class]:
        out = widths.get(width, width)
        shapes |= {f"{ours}/kernel": (config.hidden_size, out), f"{ours}/bias": (out,)}
    return shapes


# Our top-level layer that tells a class's parameters (none of them: a `BertModel`'s).
_CLASS_OF_LAYER = {
    "mlm_head": PRETRAINING,
    "head": "BertForSequenceClassification",
    "qa_outputs": "BertForQuestionAnswering",
    "classifier": "BertForTokenClassification",
}


def hf_class_of(params: Params) -> str:
    """The Hugging Face class whose parameters `params` are (by its top-level layers)."""
    return next((c for layer, c in _CLASS_OF_LAYER.items() if layer in params), "BertModel")


def label_count(params: Params) -> int | None:
    """The outputs of a sequence or token classifier's classification layer (None: no such
    layer)."""
    layer = params.get("head", params).get("classifier", {}).get("bias")
    return None if layer is None else int(np.shape(layer)[0])


def label_fields(names: list[str]) -> dict[str, Any]:
    """A HF `config.json`'s label fields for the label `names` (id order)."""
    return {
        "id2label": dict(enumerate(names)),
        "label2id": {name: i for i, name in enumerate(names)},
        "num_labels": len(names),
    }


def layout_shapes(params: Params, config: BertConfig) -> dict[str, tuple[int, ...]]:
    """The shapes `config` gives the parameters of the class `params` are (`hf_class_of`; its
    label count and, for a `BertModel`, whether it has a pooler, from `params`)."""
    hf_class, labels = hf_class_of(params), label_count(params)
    shapes = hf_expected_shapes(config, hf_class, labels or 2)
    if hf_class == "BertModel" and "nsp_head" not in params:
        shapes = {k: v for k, v in shapes.items() if k.startswith("bert/")}
    return shapes


def _hf_class_of_state(arrays: Mapping[str, Any], hf_config: Mapping[str, Any]) -> str:
    """The class of a HF state dict: its config's `architectures`, else what its names show."""
    named = [a for a in hf_config.get("architectures") or () if a in HF_CLASSES]
    if named:
        return named[0]
    if any(k.startswith("cls.") for k in arrays):
        return PRETRAINING
    if "qa_outputs.weight" in arrays:
        return "BertForQuestionAnswering"
    if "classifier.weight" in arrays:
        pooled = _POOLER[0] in arrays
        return "BertForSequenceClassification" if pooled else "BertForTokenClassification"
    return "BertModel"


def _with_prefix(arrays: dict[str, Any]) -> dict[str, Any]:
    """A `BertModel`'s own state dict names its layers without the `bert.` prefix the headed
    classes give them; ours has it."""
    if any(k.startswith("bert.") for k in arrays):
        return arrays
    heads = {hf for layers in HF_HEADS.values() for _, hf, _ in layers if "." not in hf}
    return {k if k.split(".")[0] in heads else f"bert.{k}": v for k, v in arrays.items()}


def from_hf_state_dict(
    state_dict: Mapping[str, Any], config: BertConfig, hf_class: str = PRETRAINING
) -> Params:
    """HF `hf_class` (of `HF_CLASSES`) state dict (torch tensors or numpy arrays) -> our
    `params` (layers stacked where `config.scan_layers`): `BertForPreTraining`'s tree, or the
    encoder (`bert`) with the class's layers (a `BertModel`'s pooler as `nsp_head/pooler`)."""
    check_has_layout(config)
    if config.scan_layers:
        flat_config = config.replace(scan_layers=False)
        return stack_layers(from_hf_state_dict(state_dict, flat_config, hf_class))
    arrays = _with_prefix({_normalise_hf_name(k): _to_numpy(v) for k, v in state_dict.items()})
    labels = arrays["classifier.bias"].shape[0] if "classifier.bias" in arrays else 2
    expected = hf_expected_shapes(config, hf_class, labels)
    flat, used = {}, set()
    for p in hf_param_table(config, hf_class):
        if p.hf not in arrays:
            if hf_class == "BertModel" and p.hf in _POOLER:
                continue  # no pooler: a fine-tuning task initialises its own
            raise KeyError(
                f"HF checkpoint lacks {p.hf!r} (needed for {p.ours}); a {hf_class} checkpoint "
                "is required."
            )
        value = arrays[p.hf].T if p.hf_transposed else arrays[p.hf]
        check_shape(p.hf, value, expected[p.ours])
        flat[p.ours] = np.ascontiguousarray(value, dtype=np.float32)
        used.add(p.hf)
    for tied, source in _HF_TIED.items():
        if tied in arrays and hf_class == PRETRAINING:
            if not np.array_equal(arrays[tied], arrays[source]):
                raise ValueError(
                    f"{tied} differs from {source}: only tied MLM decoders are supported."
                )
            used.add(tied)
    unknown = set(arrays) - used - set(_HF_BUFFERS)
    if unknown:
        raise ValueError(f"Unexpected HF parameters (not converted): {sorted(unknown)}.")
    return unflatten(flat)


def to_hf_state_dict(params: Params, config: BertConfig) -> dict[str, np.ndarray]:
    """Our `params` -> the state dict (numpy) of the HF class they are (`hf_class_of`):
    `BertForPreTraining`'s including the tied copies."""
    check_has_layout(config)
    config = config.replace(scan_layers=False)
    flat = flatten(unstack_layers(params))
    hf_class = hf_class_of(params)
    out = {}
    for p in hf_param_table(config, hf_class):
        if p.ours not in flat and hf_class == "BertModel" and p.hf in _POOLER:
            continue
        value = flat.pop(p.ours)
        out[p.hf] = np.ascontiguousarray(value.T if p.hf_transposed else value)
    if flat:
        raise ValueError(f"Parameters without an HF name in {hf_class}: {sorted(flat)}.")
    if hf_class == PRETRAINING:
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
    """The BertConfig of a HF BERT directory (its config.json)."""
    with open(os.path.join(directory, "config.json")) as f:
        return config_from_hf(json.load(f), **config_overrides)


def load_hf_checkpoint(directory: str, **config_overrides: Any) -> tuple[BertConfig, Params]:
    """Reads a HF directory of any of `HF_CLASSES` (its config's `architectures`, else what its
    weights show) -> (BertConfig, params in that class's layout: `from_hf_state_dict`)."""
    with open(os.path.join(directory, "config.json")) as f:
        hf_config = json.load(f)
    config = config_from_hf(hf_config, **config_overrides)
    arrays = _read_hf_weights(directory)
    return config, from_hf_state_dict(arrays, config, _hf_class_of_state(arrays, hf_config))


def save_hf_checkpoint(
    params: Params, config: BertConfig, directory: str, **hf_config: Any
) -> None:
    """Writes config.json (with `hf_config`'s fields: labels, problem type; a classifier's labels
    default to LABEL_0, ...) + model.safetensors of the class `params` are (tied copies left
    out, as `save_pretrained` does)."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    state = to_hf_state_dict(params, config)
    for tied in _HF_TIED:
        state.pop(tied, None)
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    fields = config_to_hf(config) | {"architectures": [hf_class_of(params)]}
    if label_count(params) is not None:
        fields |= label_fields([f"LABEL_{i}" for i in range(label_count(params))])
    fields |= hf_config
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(fields, f, indent=2)
