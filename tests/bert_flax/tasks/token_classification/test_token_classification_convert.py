"""The token-classification head against Hugging Face `BertForTokenClassification` (random, no
download): its weights converted by the project's converter, the logits of every real token
match a torch forward pass on the same inputs."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_flax.convert import hugging_face  # noqa: E402
from bert_flax.tasks.token_classification.model import BertForTokenClassification  # noqa: E402

VOCAB, LENGTH, LENGTHS, LABELS = 97, 12, (12, 7, 3), 5


def test_logits_match_transformers_with_the_same_parameter_names():
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64, attn_implementation="eager",
        num_labels=LABELS,
    )  # fmt: skip
    torch.manual_seed(0)
    hf_model = transformers.BertForTokenClassification(config).eval()
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    ours = hugging_face.config_from_hf(config.to_dict())
    params = hugging_face.from_hf_state_dict(state, ours, "BertForTokenClassification")
    assert set(params) == {"bert", "classifier"}  # the layout BertForTokenClassification reads
    np.testing.assert_array_equal(params["classifier"]["kernel"], state["classifier.weight"].T)
    rng = np.random.default_rng(0)
    real = np.arange(LENGTH)[None] < np.array(LENGTHS)[:, None]
    batch = {
        "input_ids": np.where(real, rng.integers(4, VOCAB, real.shape), 0).astype(np.int32),
        "token_type_ids": np.zeros(real.shape, np.int32),
        "segment_ids": real.astype(np.int32),
        "positions": np.where(real, np.arange(LENGTH)[None], 0).astype(np.int32),
    }
    with torch.no_grad():
        ref = hf_model(
            input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long),
        ).logits.numpy()
    out = BertForTokenClassification(ours, LABELS).apply(
        {"params": params}, batch, deterministic=True
    )
    np.testing.assert_allclose(np.asarray(out.logits)[real], ref[real], atol=1e-5)
    assert np.abs(ref[real]).max() > 0.1  # not a trivial agreement
