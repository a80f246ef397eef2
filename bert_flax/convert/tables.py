"""Every parameter of `BertForPreTraining` under its three names (ours, Hugging Face's, Google
BERT's), with the shapes a config gives them: what both conversions read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import flax.serialization
import flax.traverse_util
import jax
import numpy as np

from bert_flax.input_pipeline.contract import PRETRAINING_INPUTS
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig

Params = dict[str, Any]


class Param(NamedTuple):
    ours: str  # path in our params tree
    hf: str  # HF state-dict key
    tf: str  # Google TF variable name
    hf_transposed: bool  # HF stores [out, in] (torch Linear weights)
    tf_transposed: bool  # TF stores [out, in] (only cls/seq_relationship/output_weights)


def param_table(config: BertConfig) -> Iterator[Param]:
    """Every parameter under its three names. Our and TF Dense kernels are [in, out]."""

    def dense(ours, hf, tf):
        yield Param(f"{ours}/kernel", f"{hf}.weight", f"{tf}/kernel", True, False)
        yield Param(f"{ours}/bias", f"{hf}.bias", f"{tf}/bias", False, False)

    def norm(ours, hf, tf):
        yield Param(f"{ours}/scale", f"{hf}.weight", f"{tf}/gamma", False, False)
        yield Param(f"{ours}/bias", f"{hf}.bias", f"{tf}/beta", False, False)

    for table in ("word", "position", "token_type"):
        name = f"{table}_embeddings"
        yield Param(
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
    yield Param(
        "mlm_head/bias", "cls.predictions.bias", "cls/predictions/output_bias", False, False
    )
    yield Param(
        "nsp_head/classifier/kernel",
        "cls.seq_relationship.weight",
        "cls/seq_relationship/output_weights",
        True,
        True,
    )
    yield Param(
        "nsp_head/classifier/bias",
        "cls.seq_relationship.bias",
        "cls/seq_relationship/output_bias",
        False,
        False,
    )


def check_has_layout(config: BertConfig) -> None:
    if config.pre_layer_norm:
        raise ValueError("pre_layer_norm=True models have no Hugging Face / Google BERT layout.")
    if config.block_sparse is not None:
        raise ValueError("block-sparse models have no Hugging Face / Google BERT layout.")
    if config.relative_attention_buckets:
        raise ValueError(
            "models with a relative-position bias (relative_attention_buckets > 0) have no "
            "Hugging Face / Google BERT layout."
        )


def unflatten(flat: Mapping[str, np.ndarray]) -> Params:
    return flax.traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})


def flatten(params: Params) -> dict[str, np.ndarray]:
    flat = flax.traverse_util.flatten_dict(params)
    return {"/".join(k): np.asarray(v) for k, v in flat.items()}


def check_shape(name: str, value: np.ndarray, expected: tuple[int, ...]) -> None:
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
