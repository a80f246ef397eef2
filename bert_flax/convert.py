"""Checkpoint conversion: Hugging Face / Google BERT <-> bert_flax parameters.

    # HF directory (config.json + model.safetensors or pytorch_model.bin) -> bert_flax
    python -m bert_flax.convert --from_hf=/ckpt/bert-base-uncased --out=/ckpt/flax_base
    # Google BERT TF checkpoint (bert_config.json + bert_model.ckpt.*) -> bert_flax
    python -m bert_flax.convert --from_tf=/ckpt/uncased_L-12_H-768_A-12 --out=/ckpt/flax_base
    # bert_flax -> HF directory loadable by transformers.BertForPreTraining.from_pretrained
    python -m bert_flax.convert --from_flax=/ckpt/flax_base --to_hf=/ckpt/hf_base
    # a training run (bert_flax.main's workdir; latest checkpoint or --step=N) -> HF / bert_flax
    python -m bert_flax.convert --from_workdir=workdir/tiny --to_hf=/ckpt/hf_tiny

This module holds the name tables and the conversions (configs, state dicts, TF variables, HF
and Google BERT files) and the CLI; reading and writing parameters of every kind, with shape
checks, is `bert_flax.parameters`.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import flax.serialization
import flax.traverse_util
import jax
import numpy as np
from absl import app, flags, logging

from bert_flax import cli
from bert_flax.config import BertConfig
from bert_flax.data.contract import PRETRAINING_INPUTS
from bert_flax.model import BertForPreTraining, stack_layers, unstack_layers

Params = dict[str, Any]

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
# The Google BERT code's "gelu" is the tanh approximation.
_TF_ACTS = {"gelu": "gelu_tanh", "relu": "relu"}


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


def config_from_tf(tf_config: Mapping[str, Any], **overrides: Any) -> BertConfig:
    """BertConfig from a Google BERT `bert_config.json` dict (LayerNorm eps is 1e-12 there)."""
    act = tf_config.get("hidden_act", "gelu")
    if act not in _TF_ACTS:
        raise ValueError(f"hidden_act={act!r} is not supported; known: {sorted(_TF_ACTS)}.")
    hf_like = {**tf_config, "hidden_act": "gelu"}
    return config_from_hf(hf_like, hidden_act=_TF_ACTS[act], layer_norm_eps=1e-12, **overrides)


def config_to_hf(config: BertConfig) -> dict[str, Any]:
    """Hugging Face `config.json` dict for a BertConfig (post-LN models only)."""
    _check_hf_compatible(config)
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


def _check_hf_compatible(config: BertConfig) -> None:
    if config.pre_layer_norm:
        raise ValueError("pre_layer_norm=True models have no Hugging Face / Google BERT layout.")
    if config.block_sparse is not None:
        raise ValueError("block-sparse models have no Hugging Face / Google BERT layout.")
    if config.relative_attention_buckets:
        raise ValueError(
            "models with a relative-position bias (relative_attention_buckets > 0) have no "
            "Hugging Face / Google BERT layout."
        )


# ---------------------------------------------------------------------------------------------
# The name table.


class _Param(NamedTuple):
    ours: str  # path in our params tree
    hf: str  # HF state-dict key
    tf: str  # Google TF variable name
    hf_transposed: bool  # HF stores [out, in] (torch Linear weights)
    tf_transposed: bool  # TF stores [out, in] (only cls/seq_relationship/output_weights)


def _param_table(config: BertConfig) -> Iterator[_Param]:
    """Every parameter under its three names. Our and TF Dense kernels are [in, out]."""

    def dense(ours, hf, tf):
        yield _Param(f"{ours}/kernel", f"{hf}.weight", f"{tf}/kernel", True, False)
        yield _Param(f"{ours}/bias", f"{hf}.bias", f"{tf}/bias", False, False)

    def norm(ours, hf, tf):
        yield _Param(f"{ours}/scale", f"{hf}.weight", f"{tf}/gamma", False, False)
        yield _Param(f"{ours}/bias", f"{hf}.bias", f"{tf}/beta", False, False)

    for table in ("word", "position", "token_type"):
        name = f"{table}_embeddings"
        yield _Param(
            f"bert/embeddings/{name}/embedding",
            f"bert.embeddings.{name}.weight",
            f"bert/embeddings/{name}",
            False,
            False,
        )
    yield from norm(
        "bert/embeddings/layer_norm", "bert.embeddings.LayerNorm", "bert/embeddings/LayerNorm"
    )
    for i in range(config.num_layers):
        ours, hf, tf = f"bert/layer_{i}", f"bert.encoder.layer.{i}", f"bert/encoder/layer_{i}"
        for proj in ("query", "key", "value"):
            yield from dense(
                f"{ours}/attention/{proj}",
                f"{hf}.attention.self.{proj}",
                f"{tf}/attention/self/{proj}",
            )
        yield from dense(
            f"{ours}/attention/output",
            f"{hf}.attention.output.dense",
            f"{tf}/attention/output/dense",
        )
        yield from norm(
            f"{ours}/attention_layer_norm",
            f"{hf}.attention.output.LayerNorm",
            f"{tf}/attention/output/LayerNorm",
        )
        yield from dense(
            f"{ours}/ffn/intermediate", f"{hf}.intermediate.dense", f"{tf}/intermediate/dense"
        )
        yield from dense(f"{ours}/ffn/output", f"{hf}.output.dense", f"{tf}/output/dense")
        yield from norm(
            f"{ours}/ffn_layer_norm", f"{hf}.output.LayerNorm", f"{tf}/output/LayerNorm"
        )
    yield from dense("nsp_head/pooler", "bert.pooler.dense", "bert/pooler/dense")
    yield from dense(
        "mlm_head/transform", "cls.predictions.transform.dense", "cls/predictions/transform/dense"
    )
    yield from norm(
        "mlm_head/layer_norm",
        "cls.predictions.transform.LayerNorm",
        "cls/predictions/transform/LayerNorm",
    )
    yield _Param(
        "mlm_head/bias", "cls.predictions.bias", "cls/predictions/output_bias", False, False
    )
    yield _Param(
        "nsp_head/classifier/kernel",
        "cls.seq_relationship.weight",
        "cls/seq_relationship/output_weights",
        True,
        True,
    )
    yield _Param(
        "nsp_head/classifier/bias",
        "cls.seq_relationship.bias",
        "cls/seq_relationship/output_bias",
        False,
        False,
    )


# Tied copies HF keeps in `state_dict()`; checked for equality on import, re-created on export.
_HF_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# Non-parameter buffers HF may store.
_HF_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")


def _unflatten(flat: Mapping[str, np.ndarray]) -> Params:
    return flax.traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})


def _flatten(params: Params) -> dict[str, np.ndarray]:
    flat = flax.traverse_util.flatten_dict(params)
    return {"/".join(k): np.asarray(v) for k, v in flat.items()}


def _normalise_hf_name(name: str) -> str:
    """Old BERT checkpoints (e.g. the original bert-base-uncased .bin) name LayerNorm params
    gamma/beta; HF renames them on load, so do we."""
    if ".LayerNorm." in name:
        name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight")
        name = name.replace(".LayerNorm.beta", ".LayerNorm.bias")
    return name


def _check_shape(name: str, value: np.ndarray, expected: tuple[int, ...]) -> None:
    if value.shape != expected:
        raise ValueError(
            f"{name}: shape {value.shape} does not match the config's {expected}; "
            "is config.json the checkpoint's own?"
        )


def expected_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """{"bert/layer_0/...": shape} of `BertForPreTraining(config)`'s parameters."""
    batch = {name: jax.ShapeDtypeStruct((1, 1), np.int32) for name in PRETRAINING_INPUTS}
    model = BertForPreTraining(config)
    shapes = jax.eval_shape(lambda b: model.init(jax.random.key(0), b, deterministic=True), batch)
    flat = flax.traverse_util.flatten_dict(nn.unbox(shapes)["params"], sep="/")
    return {k: v.shape for k, v in flat.items()}


# ---------------------------------------------------------------------------------------------
# Hugging Face.


def _qa_param_table(config: BertConfig) -> Iterator[_Param]:
    """`BertForQuestionAnswering`'s parameters: the encoder (no pooler) and `qa_outputs`."""
    yield from (p for p in _param_table(config) if p.ours.startswith("bert/"))
    yield _Param("qa_outputs/kernel", "qa_outputs.weight", "", True, False)
    yield _Param("qa_outputs/bias", "qa_outputs.bias", "", False, False)


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
    _check_hf_compatible(config)
    if config.scan_layers:
        flat_config = config.replace(scan_layers=False)
        return stack_layers(from_hf_state_dict(state_dict, flat_config,
                                               question_answering=question_answering))  # fmt: skip
    arrays = {_normalise_hf_name(k): _to_numpy(v) for k, v in state_dict.items()}
    if question_answering:
        table, expected, model = _qa_param_table, qa_expected_shapes(config), "ForQuestionAnswering"
    else:
        table, expected, model = _param_table, expected_shapes(config), "ForPreTraining"
    flat, used = {}, set()
    for p in table(config):
        if p.hf not in arrays:
            raise KeyError(
                f"HF checkpoint lacks {p.hf!r} (needed for {p.ours}); a Bert{model} checkpoint "
                "is required (BertModel-only checkpoints have no heads)."
            )
        value = arrays[p.hf].T if p.hf_transposed else arrays[p.hf]
        _check_shape(p.hf, value, expected[p.ours])
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
    return _unflatten(flat)


def to_hf_state_dict(
    params: Params, config: BertConfig, *, question_answering: bool = False
) -> dict[str, np.ndarray]:
    """Our `params` -> HF `BertForPreTraining` (including the tied copies) or, with
    `question_answering`, `BertForQuestionAnswering` state dict (numpy)."""
    _check_hf_compatible(config)
    config = config.replace(scan_layers=False)
    flat = _flatten(unstack_layers(params))
    out = {}
    for p in (_qa_param_table if question_answering else _param_table)(config):
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


# ---------------------------------------------------------------------------------------------
# Google BERT TensorFlow checkpoints.

_TF_IGNORED_SUFFIXES = ("/adam_m", "/adam_v", "global_step", "/Adam", "/Adam_1")


def from_tf_variables(variables: Mapping[str, np.ndarray], config: BertConfig) -> Params:
    """Google BERT variables (name -> array, as in `tf.train.load_checkpoint`) -> our params.

    Optimizer slots (adam_m, adam_v) and global_step are skipped; any other unknown variable is
    an error.
    """
    _check_hf_compatible(config)
    if config.scan_layers:
        return stack_layers(from_tf_variables(variables, config.replace(scan_layers=False)))
    expected = expected_shapes(config)
    flat, used = {}, set()
    for p in _param_table(config):
        if p.tf not in variables:
            raise KeyError(f"TF checkpoint lacks {p.tf!r} (needed for {p.ours}).")
        value = np.asarray(variables[p.tf], dtype=np.float32)
        value = value.T if p.tf_transposed else value
        _check_shape(p.tf, value, expected[p.ours])
        flat[p.ours] = np.ascontiguousarray(value)
        used.add(p.tf)
    unknown = {
        name for name in variables if name not in used and not name.endswith(_TF_IGNORED_SUFFIXES)
    }
    if unknown:
        raise ValueError(f"Unexpected TF variables (not converted): {sorted(unknown)}.")
    return _unflatten(flat)


def _tf_checkpoint_prefix(path: str) -> str:
    import tensorflow as tf

    if os.path.isdir(path):
        prefix = tf.train.latest_checkpoint(path)
        if prefix is None:
            candidates = glob.glob(os.path.join(path, "*.index"))
            if len(candidates) != 1:
                raise FileNotFoundError(
                    f"Expected one TF checkpoint (*.index) in {path!r}, found {candidates}."
                )
            prefix = candidates[0][: -len(".index")]
        return prefix
    return path


def read_tf_config(
    path: str, config_path: str | None = None, **config_overrides: Any
) -> BertConfig:
    """The BertConfig of a Google BERT checkpoint (directory or prefix): `config_path`, default
    the bert_config.json beside it."""
    if config_path is None:
        config_path = os.path.join(os.path.dirname(_tf_checkpoint_prefix(path)), "bert_config.json")
    with open(config_path) as f:
        return config_from_tf(json.load(f), **config_overrides)


def load_tf_checkpoint(
    path: str, config_path: str | None = None, **config_overrides: Any
) -> tuple[BertConfig, Params]:
    """Reads a Google BERT checkpoint (directory or prefix) and its bert_config.json."""
    import tensorflow as tf

    config = read_tf_config(path, config_path, **config_overrides)
    reader = tf.train.load_checkpoint(_tf_checkpoint_prefix(path))
    names = reader.get_variable_to_shape_map()
    variables = {name: reader.get_tensor(name) for name in names}
    return config, from_tf_variables(variables, config)


# ---------------------------------------------------------------------------------------------
# Command line.

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags (defined only when run as a program: `parameters` imports this module)."""
    flags.DEFINE_string("from_hf", None, "HF directory: config.json + model.safetensors / .bin.")
    flags.DEFINE_string("from_tf", None, "Google BERT checkpoint directory or prefix.")
    flags.DEFINE_string("tf_config", None, "bert_config.json (default: next to the TF checkpoint).")
    flags.DEFINE_string("from_flax", None, "bert_flax directory written by this tool.")
    flags.DEFINE_string("from_workdir", None, "A bert_flax.main workdir (its latest checkpoint).")
    flags.DEFINE_integer(
        "step", None, "With --from_workdir: the checkpoint step (default: latest)."
    )
    flags.DEFINE_string(
        "out", None, "Output bert_flax directory (params.msgpack + bert_config.json)."
    )
    flags.DEFINE_string("to_hf", None, "Output HF directory (config.json + model.safetensors).")


def main(argv: list[str]) -> None:
    del argv
    # The CLI sits above `parameters`, which builds on this module's tables.
    from bert_flax import parameters

    sources = [s for s in (FLAGS.from_hf, FLAGS.from_tf, FLAGS.from_flax, FLAGS.from_workdir) if s]
    if len(sources) != 1:
        raise app.UsageError(
            "Give exactly one of --from_hf, --from_tf, --from_flax, --from_workdir."
        )
    if FLAGS.step is not None and not FLAGS.from_workdir:
        raise app.UsageError("--step selects a checkpoint of --from_workdir.")
    if not (FLAGS.out or FLAGS.to_hf):
        raise app.UsageError("Give --out (bert_flax) and/or --to_hf (Hugging Face).")
    if FLAGS.from_hf:
        config, params = load_hf_checkpoint(FLAGS.from_hf)
    elif FLAGS.from_tf:
        config, params = load_tf_checkpoint(FLAGS.from_tf, FLAGS.tf_config)
    elif FLAGS.from_workdir:
        config, params = parameters.load_workdir(FLAGS.from_workdir, FLAGS.step)
    else:
        config, params = parameters.load_params(FLAGS.from_flax)
    count = sum(v.size for v in _flatten(params).values())
    logging.info("Converted %d parameters (%s).", count, config)
    if FLAGS.out:
        parameters.save_params(params, config, FLAGS.out)
        logging.info("Wrote %s", FLAGS.out)
    if FLAGS.to_hf:
        save_hf_checkpoint(params, config, FLAGS.to_hf)
        logging.info("Wrote %s", FLAGS.to_hf)
    print(f"converted {count:,} parameters")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
