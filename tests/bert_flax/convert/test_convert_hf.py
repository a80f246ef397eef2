"""Agreement with Hugging Face `BertForPreTraining` (random, no download) through the converter."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_flax.convert import hugging_face  # noqa: E402
from bert_flax.model.bert import BertForPreTraining  # noqa: E402
from bert_flax.model.config import BertConfig  # noqa: E402
from bert_flax.runs import parameters  # noqa: E402

VOCAB, LENGTH = 97, 12
LENGTHS = (12, 7, 3)  # real tokens per padded row


def _hf_model(hidden_act: str):
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        hidden_act=hidden_act,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(config).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorm parameters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def hf_model():
    return _hf_model("gelu")


def _inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(4, VOCAB, size=(len(LENGTHS), LENGTH)).astype(np.int32)
    types = (np.arange(LENGTH)[None] >= np.array([[4], [3], [1]])).astype(np.int32)
    mask = (np.arange(LENGTH)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids, types = ids * mask, types * mask
    batch = {
        "input_ids": ids,
        "token_type_ids": types,
        "segment_ids": mask,
        "positions": np.arange(LENGTH)[None].repeat(len(LENGTHS), 0) * mask,
        "masked_lm_positions": np.arange(LENGTH)[None].repeat(len(LENGTHS), 0).astype(np.int32),
        "cls_positions": np.zeros((len(LENGTHS), 1), np.int32),
    }
    return batch, mask.astype(bool)


def _compare_logits(hf, config, params):
    batch, real = _inputs()
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long),
        )
    model = BertForPreTraining(config)
    out = jax.jit(lambda p, b: model.apply({"params": p}, b, deterministic=True))(params, batch)
    mlm = np.asarray(out.mlm_logits)
    np.testing.assert_allclose(mlm[real], ref.prediction_logits.numpy()[real], atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(out.nsp_logits)[:, 0], ref.seq_relationship_logits.numpy(), atol=1e-5
    )
    assert np.abs(ref.prediction_logits.numpy()[real]).max() > 0.1  # not a trivial agreement


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new"])
def test_logits_match_transformers(hidden_act, hf_model):
    hf = hf_model if hidden_act == "gelu" else _hf_model(hidden_act)
    config = hugging_face.config_from_hf(hf.config.to_dict())
    assert config.hidden_act == {"gelu": "gelu", "gelu_new": "gelu_tanh"}[hidden_act]
    params = hugging_face.from_hf_state_dict(hf.state_dict(), config)
    _compare_logits(hf, config, params)


def test_scanned_layers_convert_both_ways(hf_model):
    """A `scan_layers` model reads and writes Hugging Face checkpoints as the unrolled one."""
    state = hf_model.state_dict()
    config = hugging_face.config_from_hf(hf_model.config.to_dict(), scan_layers=True)
    params = hugging_face.from_hf_state_dict(state, config)
    assert "layers" in params["bert"] and "layer_0" not in params["bert"]
    _compare_logits(hf_model, config, params)
    back = hugging_face.to_hf_state_dict(params, config)
    for name, value in state.items():
        np.testing.assert_array_equal(back[name], value.numpy(), err_msg=name)


def test_round_trip_is_exact(hf_model):
    state = hf_model.state_dict()
    config = hugging_face.config_from_hf(hf_model.config.to_dict())
    back = hugging_face.to_hf_state_dict(hugging_face.from_hf_state_dict(state, config), config)
    assert set(back) == set(state)
    for name, value in state.items():
        np.testing.assert_array_equal(back[name], value.numpy(), err_msg=name)
    fresh = transformers.BertForPreTraining(hf_model.config)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


def test_directories_and_cli(hf_model, tmp_path):
    hf_dir, bin_dir = tmp_path / "hf", tmp_path / "bin"
    hf_model.save_pretrained(hf_dir)  # model.safetensors, tied decoder left out
    config, params = hugging_face.load_hf_checkpoint(str(hf_dir))
    # An old-style .bin with LayerNorm gamma/beta names reads the same.
    bin_dir.mkdir()
    old_names = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in hf_model.state_dict().items()
    }
    torch.save(old_names, bin_dir / "pytorch_model.bin")
    (bin_dir / "config.json").write_text(json.dumps(hf_model.config.to_dict()))
    _, from_bin = hugging_face.load_hf_checkpoint(str(bin_dir))
    jax.tree.map(np.testing.assert_array_equal, from_bin, params)

    # A cased vocabulary beside the weights travels with them, its case setting too.
    (hf_dir / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nParis\n")
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    flax_dir, hf_out = tmp_path / "flax", tmp_path / "hf_out"
    cmd = [sys.executable, "-m", "bert_flax.convert", f"--from_hf={hf_dir}"]
    cmd += [f"--out={flax_dir}", f"--to_hf={hf_out}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded_config, loaded = parameters.load_params(str(flax_dir))
    assert loaded_config == config
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    for out in (flax_dir, hf_out):
        assert (out / "vocab.txt").read_text() == (hf_dir / "vocab.txt").read_text()
        assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert transformers.AutoTokenizer.from_pretrained(hf_out).tokenize("Paris") == ["Paris"]
    reloaded = transformers.BertForPreTraining.from_pretrained(hf_out)
    for name, value in hf_model.state_dict().items():
        np.testing.assert_array_equal(reloaded.state_dict()[name].numpy(), value.numpy())


def test_bad_checkpoints_are_rejected(hf_model):
    state = dict(hf_model.state_dict())
    config = hugging_face.config_from_hf(hf_model.config.to_dict())
    with pytest.raises(KeyError, match=r"cls\.seq_relationship\.weight"):
        hugging_face.from_hf_state_dict(
            {k: v for k, v in state.items() if "seq_rel" not in k}, config
        )
    with pytest.raises(ValueError, match="Unexpected HF parameters"):
        hugging_face.from_hf_state_dict(
            {**state, "classifier.weight": state["cls.predictions.bias"]}, config
        )
    with pytest.raises(ValueError, match="does not match the config"):
        hugging_face.from_hf_state_dict(state, config.replace(intermediate_size=64))
    untied = {
        **state,
        "cls.predictions.decoder.weight": state["cls.predictions.decoder.weight"] + 1,
    }
    with pytest.raises(ValueError, match="tied"):
        hugging_face.from_hf_state_dict(untied, config)
    with pytest.raises(ValueError, match="position_embedding_type"):
        hugging_face.config_from_hf(
            {**hf_model.config.to_dict(), "position_embedding_type": "relative_key"}
        )


@pytest.mark.parametrize(
    "field,value",
    [("pre_layer_norm", True), ("relative_attention_buckets", 8)],
)
def test_models_without_a_bert_layout_are_refused(field, value):
    with pytest.raises(ValueError, match="no Hugging Face / Google BERT layout"):
        hugging_face.config_to_hf(BertConfig.preset("tiny", **{field: value}))
