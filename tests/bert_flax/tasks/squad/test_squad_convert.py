"""The QA head to and from Hugging Face `BertForQuestionAnswering` (random, no download): its
start and end logits against a torch forward pass on the same inputs, and an exact round trip."""

import flax
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_flax.convert import hugging_face  # noqa: E402
from bert_flax.tasks.squad.model import BertForQuestionAnswering  # noqa: E402

VOCAB, LENGTH, LENGTHS = 97, 12, (12, 7, 3)
QA = "BertForQuestionAnswering"


@pytest.fixture(scope="module")
def hf_model():
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForQuestionAnswering(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def padded_rows():
    rng = np.random.default_rng(0)
    real = np.arange(LENGTH)[None] < np.array(LENGTHS)[:, None]
    ids = np.where(real, rng.integers(4, VOCAB, (len(LENGTHS), LENGTH)), 0).astype(np.int32)
    types = np.where(real, np.arange(LENGTH)[None] >= 3, 0).astype(np.int32)
    positions = np.where(real, np.arange(LENGTH)[None], 0).astype(np.int32)
    return {"input_ids": ids, "token_type_ids": types, "segment_ids": real.astype(np.int32),
            "positions": positions}, real  # fmt: skip


@pytest.mark.parametrize("scan_layers", [False, True])
def test_start_and_end_logits_match_transformers(hf_model, scan_layers):
    config = hugging_face.config_from_hf(hf_model.config.to_dict(), scan_layers=scan_layers)
    params = hugging_face.from_hf_state_dict(hf_model.state_dict(), config, QA)
    batch, real = padded_rows()
    with torch.no_grad():
        ref = hf_model(
            input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long),
        )
    out = BertForQuestionAnswering(config).apply({"params": params}, batch, deterministic=True)
    for ours, theirs in ((out.start_logits, ref.start_logits), (out.end_logits, ref.end_logits)):
        np.testing.assert_allclose(np.asarray(ours)[real], theirs.numpy()[real], atol=1e-5)
    assert np.abs(ref.start_logits.numpy()[real]).max() > 0.1  # not a trivial agreement


def test_round_trip_is_exact_and_the_tree_is_the_models(hf_model):
    state = hf_model.state_dict()
    config = hugging_face.config_from_hf(hf_model.config.to_dict())
    params = hugging_face.from_hf_state_dict(state, config, QA)
    batch, _ = padded_rows()
    init = BertForQuestionAnswering(config).init(jax.random.key(0), batch, deterministic=True)
    shapes = lambda tree: jax.tree.map(np.shape, flax.traverse_util.flatten_dict(tree))
    assert shapes(params) == shapes(flax.linen.unbox(init)["params"])
    back = hugging_face.to_hf_state_dict(params, config)
    assert set(back) == set(state) - {"bert.embeddings.position_ids"}
    for name in back:
        np.testing.assert_array_equal(back[name], state[name].numpy(), err_msg=name)


def test_a_pretraining_checkpoint_is_not_a_qa_one(hf_model):
    config = hugging_face.config_from_hf(hf_model.config.to_dict())
    state = {k: v for k, v in hf_model.state_dict().items() if not k.startswith("qa_outputs")}
    with pytest.raises(KeyError, match=r"qa_outputs.weight.*BertForQuestionAnswering"):
        hugging_face.from_hf_state_dict(state, config, QA)
