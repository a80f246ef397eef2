"""Any BERT in: transformers `BertModel` (encoder only, with or without a pooler) and task-headed
folders (`BertForSequenceClassification`, `...QuestionAnswering`, `...TokenClassification`)
read as parameters of the class they are, checked against transformers' forward passes; what a
fine-tuning task keeps of them; pre-training refusing a model without its heads; and the case
setting taken from a checkpoint's `tokenizer_config.json`."""

from __future__ import annotations

import json
import types

import flax
import jax
import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_flax.convert import finetuned, hugging_face  # noqa: E402
from bert_flax.runs import parameters, pretrained  # noqa: E402
from bert_flax.tasks.classification import ClassificationTask  # noqa: E402
from bert_flax.tasks.classification.model import BertForSequenceClassification  # noqa: E402
from bert_flax.tasks.finetuning import task_vocab  # noqa: E402
from bert_flax.tasks.pretraining import PreTrainingTask  # noqa: E402
from configs import finetune_sentiment  # noqa: E402

VOCAB, LENGTH, LENGTHS = 97, 12, (12, 7, 3)
HF_CONFIG = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=48, max_position_embeddings=64, attn_implementation="eager",
)  # fmt: skip


def hf_model(cls, pooler: bool = True, **fields):
    """A transformers BERT of class `cls` with random, non-trivial parameters."""
    torch.manual_seed(0)
    config = transformers.BertConfig(**HF_CONFIG, **fields)
    model = cls(config, add_pooling_layer=pooler) if cls is transformers.BertModel else cls(config)
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def saved(model, tmp_path, name: str) -> tuple:
    """`model` saved as transformers does, read back by `init_from`'s reader."""
    model.save_pretrained(tmp_path / name)
    return pretrained.load_pretrained(str(tmp_path / name))


def padded_rows():
    rng = np.random.default_rng(0)
    real = np.arange(LENGTH)[None] < np.array(LENGTHS)[:, None]
    ids = np.where(real, rng.integers(4, VOCAB, (len(LENGTHS), LENGTH)), 0).astype(np.int32)
    rows = {"input_ids": ids, "token_type_ids": np.zeros_like(ids),
            "segment_ids": real.astype(np.int32),
            "positions": np.where(real, np.arange(LENGTH)[None], 0).astype(np.int32),
            "cls_positions": np.zeros((len(LENGTHS), 1), np.int32)}  # fmt: skip
    return rows, {k: torch.from_numpy(rows[k]).long() for k in ("input_ids", "token_type_ids")}


def classifier_init(config, num_labels: int) -> dict:
    rows, _ = padded_rows()
    model = BertForSequenceClassification(config, num_labels)
    return flax.linen.unbox(model.init(jax.random.key(1), rows, deterministic=True))["params"]


def classification_task(num_labels: int):
    """What `ClassificationTask.pretrained_params` reads of its task."""
    config = ml_collections.ConfigDict({"classifier": {"rescale_embeddings": False}})
    labelled = types.SimpleNamespace(num_labels=num_labels)
    return types.SimpleNamespace(config=config, labelled=labelled)


def classify(config, params, num_labels: int) -> np.ndarray:
    rows, _ = padded_rows()
    out = BertForSequenceClassification(config, num_labels).apply(
        {"params": params}, rows, deterministic=True
    )
    return np.asarray(out.logits)[:, 0]


def hf_logits(model, **inputs) -> np.ndarray:
    _, torch_inputs = padded_rows()
    mask = torch.from_numpy(padded_rows()[0]["segment_ids"]).long()
    with torch.no_grad():
        return model(**torch_inputs, attention_mask=mask, **inputs).logits.numpy()


def test_an_encoder_only_bert_model_gives_a_classifier_its_encoder_and_pooler(tmp_path):
    encoder = hf_model(transformers.BertModel)
    config, params = saved(encoder, tmp_path, "bert")
    assert set(params) == {"bert", "nsp_head"}  # the pooler where BertForPreTraining has it
    start = classifier_init(config, 2)
    merged = ClassificationTask.pretrained_params(classification_task(2), params, start)
    parameters.check_params_fit(merged, parameters.flat_shapes(start), "bert")
    # The reference: transformers' classifier on the same encoder and classification layer.
    reference = transformers.BertForSequenceClassification(encoder.config).eval()
    reference.bert.load_state_dict(encoder.state_dict())
    layer = merged["head"]["classifier"]
    with torch.no_grad():
        reference.classifier.weight.copy_(torch.from_numpy(np.array(layer["kernel"]).T))
        reference.classifier.bias.copy_(torch.from_numpy(np.array(layer["bias"])))
    np.testing.assert_allclose(classify(config, merged, 2), hf_logits(reference), atol=1e-5)
    # A bert_flax directory of it (convert --from_hf --out) reads back, shapes checked.
    parameters.save_params(params, config, str(tmp_path / "flax"))
    jax.tree.map(np.testing.assert_array_equal, parameters.load_params(str(tmp_path / "flax"))[1],
                 params)  # fmt: skip


def test_without_a_pooler_a_classifier_keeps_its_own_and_pre_training_refuses(tmp_path):
    config, params = saved(hf_model(transformers.BertModel, pooler=False), tmp_path, "bert")
    assert set(params) == {"bert"}
    start = classifier_init(config, 2)
    merged = ClassificationTask.pretrained_params(classification_task(2), params, start)
    jax.tree.map(np.testing.assert_array_equal, merged["head"], start["head"])
    task = types.SimpleNamespace(config=ml_collections.ConfigDict({"init_from": "bert"}))
    with pytest.raises(ValueError, match=r"holds no pre-training heads.*Fine-tune from it"):
        PreTrainingTask.pretrained_params(task, params, None)


def test_a_sequence_classifier_keeps_its_head_when_the_labels_fit(tmp_path):
    model = hf_model(transformers.BertForSequenceClassification, num_labels=3)
    config, params = saved(model, tmp_path, "classifier")
    assert set(params) == {"bert", "head"}
    np.testing.assert_allclose(classify(config, params, 3), hf_logits(model), atol=1e-5)
    kept = ClassificationTask.pretrained_params(classification_task(3), params,
                                                classifier_init(config, 3))  # fmt: skip
    assert kept is params
    start = classifier_init(config, 2)
    dropped = ClassificationTask.pretrained_params(classification_task(2), params, start)
    np.testing.assert_array_equal(dropped["head"]["pooler"]["kernel"],
                                  params["head"]["pooler"]["kernel"])  # fmt: skip
    np.testing.assert_array_equal(dropped["head"]["classifier"]["kernel"],
                                  start["head"]["classifier"]["kernel"])  # fmt: skip


@pytest.mark.parametrize(
    "cls,layers",
    [
        (transformers.BertForSequenceClassification, {"bert", "head"}),
        (transformers.BertForQuestionAnswering, {"bert", "qa_outputs"}),
        (transformers.BertForTokenClassification, {"bert", "classifier"}),
        (transformers.BertModel, {"bert", "nsp_head"}),
    ],
)
def test_every_class_converts_back_to_itself(tmp_path, cls, layers):
    model = hf_model(cls, **({"num_labels": 5} if "Classification" in cls.__name__ else {}))
    config, params = saved(model, tmp_path, "in")
    assert set(params) == layers
    hugging_face.save_hf_checkpoint(params, config, str(tmp_path / "out"))
    back = cls.from_pretrained(tmp_path / "out").state_dict()
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(back[name].numpy(), value.numpy(), err_msg=name)


CASED_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Paris", "paris", "is", "in", "France"]


def test_a_cased_checkpoint_keeps_the_case_unless_the_config_says(tmp_path):
    checkpoint = tmp_path / "cased"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(HF_CONFIG))
    (checkpoint / "vocab.txt").write_text("\n".join(CASED_WORDS) + "\n")
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    config = finetune_sentiment.get_config()
    config.init_from = str(checkpoint)
    vocab = task_vocab(config)
    tokens = vocab.tokenizer.encode("Paris is in France", add_special_tokens=False).tokens
    assert tokens == ["Paris", "is", "in", "France"] and vocab.lowercase is False
    # Exported with the run's case setting: transformers' tokenizer agrees.
    model_config = hugging_face.read_hf_config(str(checkpoint))
    finetuned.save_tokenizer(str(tmp_path / "hf"), vocab.path, vocab.lowercase, model_config)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tokenizer.tokenize("Paris is in France") == tokens
    # A fine-tuning run records it (what --predict and the export read), and its data identity
    # tells a cased run from an uncased one.
    (tmp_path / "train.csv").write_text("text,label\nParis is in France,a\nis in,b\n")
    config.data.update(train_file=str(tmp_path / "train.csv"), validation_file=str(
        tmp_path / "train.csv"), max_seq_length=16)  # fmt: skip
    cased = ClassificationTask(config)
    assert cased.head_config()["lowercase"] is False
    config.data.lowercase = True  # the config overrides the checkpoint
    lowered = task_vocab(config).tokenizer.encode("Paris", add_special_tokens=False).tokens
    assert lowered == ["paris"]
    uncased = ClassificationTask(config)
    assert uncased.head_config()["lowercase"] is True
    assert uncased.identity() != cased.identity()
