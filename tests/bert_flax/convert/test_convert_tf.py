"""Conversion of a Google BERT TensorFlow checkpoint written here with Google variable names."""

import json
import re

import jax
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_flax.convert import google_bert, hugging_face  # noqa: E402


def _google_name(hf_name: str) -> tuple[str, bool] | None:
    """HF state-dict key -> (Google BERT variable name, whether to transpose); None to skip.

    Written independently of bert_flax.convert from the layout of the original BERT code
    (modeling.py / run_pretraining.py).
    """
    if hf_name.startswith("cls.predictions.decoder."):
        return None  # tied to the word embeddings / output bias
    special = {
        "cls.predictions.bias": "cls/predictions/output_bias",
        "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
        "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
    }
    if hf_name in special:
        return special[hf_name], False  # output_weights is [2, hidden] in both
    name = re.sub(r"\.layer\.(\d+)\.", r".layer_\1.", hf_name).replace(".", "/")
    if name.endswith("_embeddings/weight"):
        return name[: -len("/weight")], False
    if "/LayerNorm/" in name:
        return name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
    if name.endswith("/weight"):
        return name[: -len("/weight")] + "/kernel", True
    return name, False


def _write_google_checkpoint(state_dict, directory):
    names, tensors = [], []
    for hf_name, value in state_dict.items():
        mapped = _google_name(hf_name)
        if mapped is None:
            continue
        name, transpose = mapped
        array = value.numpy().T if transpose else value.numpy()
        names.append(name)
        tensors.append(tf.constant(array))
        names.append(name + "/adam_m")  # optimizer slots, as in a pre-training checkpoint
        tensors.append(tf.zeros_like(array))
    names.append("global_step")
    tensors.append(tf.constant(1000, tf.int64))
    prefix = str(directory / "bert_model.ckpt")
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    return prefix


def test_google_checkpoint_matches_hf_conversion(tmp_path):
    hf_config = transformers.BertConfig(
        vocab_size=61,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
    )
    torch.manual_seed(1)
    model = transformers.BertForPreTraining(hf_config)
    _write_google_checkpoint(model.state_dict(), tmp_path)
    google_config = {k: hf_config.to_dict()[k] for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "max_position_embeddings", "type_vocab_size", "initializer_range",
        "hidden_dropout_prob", "attention_probs_dropout_prob",
    )}  # fmt: skip
    google_config["hidden_act"] = "gelu"
    (tmp_path / "bert_config.json").write_text(json.dumps(google_config))

    config, params = google_bert.load_tf_checkpoint(str(tmp_path))
    assert config.hidden_act == "gelu_tanh"  # the Google code's gelu is the tanh approximation
    expected = hugging_face.from_hf_state_dict(model.state_dict(), config)
    jax.tree.map(np.testing.assert_array_equal, params, expected)


def test_unknown_tf_variable_is_an_error():
    config = google_bert.config_from_tf(
        dict(
            vocab_size=11,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=8,
        )
    )
    with pytest.raises(KeyError, match="bert/embeddings/word_embeddings"):
        google_bert.from_tf_variables({}, config)
