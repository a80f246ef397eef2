"""Packed fine-tuning against one example per row: the same logits and per-sequence loss, packed
inference equal to padded inference example by example, and pre-trained encoders carried over."""

from __future__ import annotations

import json
import types

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

from bert_flax.data import tokenization
from bert_flax.input_pipeline import rows as data_rows
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.rows import build_rows
from bert_flax.model.bert import EMBEDDING_TABLES, BertForPreTraining, BertModel, rescale_embeddings
from bert_flax.model.config import INIT_FROM_PRESET, BertConfig
from bert_flax.runs import parameters
from bert_flax.tasks.classification import ClassificationTask
from bert_flax.tasks.classification import data as classification
from bert_flax.tasks.classification.model import (
    BertForSequenceClassification,
    ClassificationOutput,
    classification_loss,
    mean_states,
    pretrained_encoder,
)
from bert_flax.tasks.classification.predict import predict, write_predictions
from bert_flax.train.setup import adjust_for_packing, run_length

MAX_LEN = 64
CONFIG = BertConfig.preset(
    "tiny",
    num_layers=2,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=MAX_LEN,
    vocab_size=30522,
)
TEXTS = [
    "a gripping, beautifully shot film",
    "dull",
    "the plot goes nowhere and the jokes fall flat , though the cast tries hard",
    "one of the year's best",
    "an uneven but often charming comedy",
    "i wanted to like it more than i did",
    "not worth the ticket",
    "a triumph",
    "too long by half, and far too pleased with itself",
    "sharp , funny and humane",
    "it never quite decides what it wants to be",
]


@pytest.fixture(scope="module")
def encoded():
    split = classification.LabelledSplit(
        texts=TEXTS,
        texts_b=None,
        labels=np.arange(len(TEXTS), dtype=np.int32) % 3,
        ids=np.arange(100, 100 + len(TEXTS), dtype=np.int32),
    )
    return classification.encode_split(tokenization.load_vocab(), split, MAX_LEN)


@pytest.fixture(scope="module")
def params(encoded):
    rows = build_rows(encoded, [[0]], RowShape(MAX_LEN, 1))
    model = BertForSequenceClassification(CONFIG, num_labels=3)
    return model.init(jax.random.key(0), rows, deterministic=True)["params"]


def per_example(batch, values):
    """{example id: value} of the real slots of a batch."""
    real = batch["example_ids"] >= 0
    return dict(zip(batch["example_ids"][real].tolist(), values[real]))


def test_packed_rows_give_each_example_its_own_logits_and_loss(encoded, params):
    model = BertForSequenceClassification(CONFIG, num_labels=3)
    packs = data_rows.pack_examples(encoded.lengths, MAX_LEN, 4, seed=1)
    assert max(len(p) for p in packs) > 1  # really packed
    packed = build_rows(encoded, packs, RowShape(MAX_LEN, 4))
    single = build_rows(encoded, [[i] for i in range(len(encoded))], RowShape(MAX_LEN, 1))
    outputs = {}
    for name, batch in (("packed", packed), ("single", single)):
        output = model.apply({"params": params}, batch, deterministic=True)
        loss, metrics = classification_loss(output, batch)
        outputs[name] = (per_example(batch, np.asarray(output.logits)), float(loss), metrics)
    packed_logits, single_logits = outputs["packed"][0], outputs["single"][0]
    assert sorted(packed_logits) == sorted(single_logits) == encoded.ids.tolist()
    for example_id, logits in single_logits.items():
        np.testing.assert_allclose(packed_logits[example_id], logits, atol=2e-5)
    # The per-sequence loss: the mean over examples, however they are arranged in rows.
    assert outputs["packed"][1] == pytest.approx(outputs["single"][1], rel=1e-5)
    reference = np.mean(
        [
            -jax.nn.log_softmax(single_logits[i])[label]
            for i, label in zip(encoded.ids.tolist(), encoded.labels)
        ]
    )
    assert outputs["single"][1] == pytest.approx(float(reference), rel=1e-5)
    assert float(outputs["packed"][2]["accuracy"][1]) == len(encoded)


def test_mean_pooling_reads_each_examples_own_tokens(encoded, params):
    """Mean pooling: packed logits equal single-example logits, and the pooled state is the
    numpy mean of the example's hidden states."""
    model = BertForSequenceClassification(CONFIG, num_labels=3, pooling="mean")
    packs = data_rows.pack_examples(encoded.lengths, MAX_LEN, 4, seed=1)
    packed = build_rows(encoded, packs, RowShape(MAX_LEN, 4))
    single = build_rows(encoded, [[i] for i in range(len(encoded))], RowShape(MAX_LEN, 1))
    logits = {
        name: per_example(
            batch, np.asarray(model.apply({"params": params}, batch, deterministic=True).logits)
        )
        for name, batch in (("packed", packed), ("single", single))
    }
    for example_id, value in logits["single"].items():
        np.testing.assert_allclose(logits["packed"][example_id], value, atol=2e-5)
    cls_logits = (
        BertForSequenceClassification(CONFIG, num_labels=3)
        .apply({"params": params}, single, deterministic=True)
        .logits
    )
    assert not np.allclose(np.asarray(cls_logits)[:, 0], [logits["single"][i] for i in encoded.ids])
    hidden = np.asarray(
        BertModel(CONFIG).apply(
            {"params": params["bert"]},
            packed["input_ids"],
            packed["token_type_ids"],
            packed["positions"],
            packed["segment_ids"],
            deterministic=True,
        )
    )
    states = np.asarray(mean_states(hidden, packed["segment_ids"], 4))
    row, slot = 0, 1
    tokens = packed["segment_ids"][row] == slot + 1
    np.testing.assert_allclose(states[row, slot], hidden[row][tokens].mean(axis=0), atol=1e-5)
    with pytest.raises(ValueError, match="pooling"):
        BertForSequenceClassification(CONFIG, num_labels=3, pooling="max").init(
            jax.random.key(0), single, deterministic=True
        )


def test_regression_loss_is_the_mean_squared_error():
    logits = np.array([[[0.5], [2.0], [9.0]]], np.float32)
    batch = {
        "labels": np.array([[1.0, 1.0, 0.0]], np.float32),
        "sequence_mask": np.array([[1.0, 1.0, 0.0]], np.float32),
    }
    loss, metrics = classification_loss(ClassificationOutput(logits=logits), batch)
    assert float(loss) == pytest.approx((0.25 + 1.0) / 2)
    assert float(metrics["mse"][1]) == 2.0


def test_packed_inference_equals_padded_inference_per_example(encoded, params):
    packed = predict(CONFIG, params, 3, encoded, rows=2, max_sequences_per_pack=4)
    padded = predict(CONFIG, params, 3, encoded, rows=2, packed=False)
    assert packed.shape == (len(encoded), 3)
    np.testing.assert_allclose(packed, padded, atol=2e-5)
    # ... and each equals the example run alone, in input order.
    model = BertForSequenceClassification(CONFIG, num_labels=3)
    for k in (0, 5, len(encoded) - 1):
        alone = build_rows(encoded, [[k]], RowShape(MAX_LEN, 1))
        logits = model.apply({"params": params}, alone, deterministic=True).logits[0, 0]
        np.testing.assert_allclose(packed[k], np.asarray(logits), atol=2e-5)


def test_pretrained_encoder_and_pooler_carry_over(encoded, params):
    pretraining = BertForPreTraining(CONFIG)
    batch = {
        "input_ids": np.ones((1, 8), np.int32),
        "token_type_ids": np.zeros((1, 8), np.int32),
        "positions": np.arange(8, dtype=np.int32)[None],
        "segment_ids": np.ones((1, 8), np.int32),
        "masked_lm_positions": np.zeros((1, 2), np.int32),
        "cls_positions": np.zeros((1, 1), np.int32),
    }
    pre = pretraining.init(jax.random.key(5), batch, deterministic=True)["params"]
    merged = pretrained_encoder(pre, params)
    same = jax.tree.map(np.array_equal, merged["bert"], pre["bert"])
    assert all(jax.tree.leaves(same))
    assert np.array_equal(merged["head"]["pooler"]["kernel"], pre["nsp_head"]["pooler"]["kernel"])
    assert np.array_equal(
        merged["head"]["classifier"]["kernel"], params["head"]["classifier"]["kernel"]
    )


def _embedding_table(params, name: str) -> np.ndarray:
    return np.asarray(nn.unbox(params)["bert"]["embeddings"][name]["embedding"])


def test_rescaled_embeddings_keep_the_function_at_a_fresh_scale(encoded, params):
    """Tables grown 3x (as pre-training grows them) come back to the fresh word table's standard
    deviation, all three by one factor, and the classifier's logits do not change (LayerNorm
    follows the tables' sum); `classifier.rescale_embeddings` is what turns it on."""
    grown = jax.tree.map(lambda x: x, nn.unbox(params))
    for name in EMBEDDING_TABLES:
        grown["bert"]["embeddings"][name] = {"embedding": 3.0 * _embedding_table(params, name)}
    rescaled = rescale_embeddings(grown, like=params)
    fresh_std = _embedding_table(params, "word_embeddings").std()
    assert _embedding_table(grown, "word_embeddings").std() > 2 * fresh_std
    assert _embedding_table(rescaled, "word_embeddings").std() == pytest.approx(fresh_std, 1e-5)
    for name in EMBEDDING_TABLES:
        np.testing.assert_allclose(
            _embedding_table(rescaled, name), _embedding_table(grown, name) / 3.0, rtol=1e-5
        )
    model = BertForSequenceClassification(CONFIG, num_labels=3, pooling="mean")
    rows = build_rows(encoded, [[i] for i in range(4)], RowShape(MAX_LEN, 1))
    logits = [
        model.apply({"params": p}, rows, deterministic=True).logits for p in (grown, rescaled)
    ]
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-4, atol=1e-5)

    def task(rescale: bool):
        classifier = ml_collections.ConfigDict({"rescale_embeddings": rescale})
        return types.SimpleNamespace(config=ml_collections.ConfigDict({"classifier": classifier}))

    pre = {"bert": grown["bert"], "nsp_head": {"pooler": grown["head"]["pooler"]}}
    for rescale, std in ((True, fresh_std), (False, 3 * fresh_std)):
        merged = ClassificationTask.pretrained_params(task(rescale), pre, params)
        assert _embedding_table(merged, "word_embeddings").std() == pytest.approx(std, 1e-5)


def test_init_from_preset_fine_tunes_the_checkpoints_model_in_its_vocabulary(tmp_path):
    """`config.model.preset="init_from"`: the model of `config.init_from` (here pre-LN, with a
    relative-position bias and a 1,000-word vocabulary of its own, as the demo pre-trains), the
    fields the fine-tuning config sets winning (dropout 0.1), tokenized with the vocabulary
    beside the weights (recorded for inference); the pre-trained parameters fit it. Without
    init_from: a clear error."""
    from configs import finetune_sentiment

    with open(tokenization.load_vocab().path) as f:
        words = f.read().splitlines()[:1000]  # [PAD] .. [MASK] and the first words
    pretrained = CONFIG.replace(
        pre_layer_norm=True,
        relative_attention_buckets=8,
        vocab_size=len(words),
        max_position_embeddings=128,
        hidden_dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    source = tmp_path / "pretrained"
    pre_params = BertForPreTraining(pretrained).init(
        jax.random.key(0), _pretraining_rows(pretrained), deterministic=True
    )["params"]
    parameters.save_params(nn.unbox(pre_params), pretrained, str(source))
    (source / "vocab.txt").write_text("\n".join(words) + "\n")

    config = finetune_sentiment.get_config()
    config.model.preset = INIT_FROM_PRESET
    config.init_from = str(source)
    task = ClassificationTask(config)
    assert task.vocab.size == len(words)
    assert task.head_config()["vocab_file"] == str(source / "vocab.txt")  # what --predict reads
    model_config = task.model_config()
    assert model_config == pretrained.replace(hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
    params = nn.unbox(
        task.model(model_config).init(
            jax.random.key(1), task.synthetic_batch(2, seed=0), deterministic=True
        )["params"]
    )
    merged = task.pretrained_params(nn.unbox(pre_params), params)
    parameters.check_params_fit(merged, parameters.flat_shapes(params), str(source))

    config.init_from = ""
    with pytest.raises(ValueError, match=r"set config\.init_from to a checkpoint"):
        ClassificationTask(config).model_config()


def _pretraining_rows(config: BertConfig) -> dict[str, np.ndarray]:
    """One packed row of two short sequences, as BertForPreTraining reads it."""
    return {
        "input_ids": np.array([[2, 7, 3, 2, 9, 3, 0, 0]], np.int32),
        "token_type_ids": np.zeros((1, 8), np.int32),
        "segment_ids": np.array([[1, 1, 1, 2, 2, 2, 0, 0]], np.int32),
        "positions": np.array([[0, 1, 2, 0, 1, 2, 0, 0]], np.int32),
        "masked_lm_positions": np.array([[1, 4]], np.int32),
        "cls_positions": np.array([[0, 3]], np.int32),
    }


def test_write_predictions_in_input_order(tmp_path):
    path = tmp_path / "p.jsonl"
    logits = np.array([[0.0, 2.0], [3.0, 0.0]], np.float32)
    write_predictions(str(path), [7, 3], logits, ["neg", "pos"])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in records] == [7, 3]
    assert [r["label"] for r in records] == ["pos", "neg"]
    assert records[0]["probabilities"][1] == pytest.approx(1 / (1 + np.exp(-2.0)), rel=1e-5)


@pytest.mark.slow(seconds=25)
def test_packed_inference_on_8_devices_equals_1_device(run_on_devices):
    """`predict` on a data-parallel and on a data x fsdp x model mesh of 8 simulated devices
    gives the 1-device logits, example by example (parameters split over model when it has
    devices)."""
    run_on_devices("tests.bert_flax.tasks.classification.sharded_predict_worker", 8)


def test_a_sample_of_labels_trains_at_least_min_steps_with_the_evaluations_asked():
    from configs import finetune_sentiment

    config = finetune_sentiment.get_config()
    config.data.train_examples, config.train.epochs = 100, 1.0
    task = ClassificationTask(config)
    assert len(task.labelled.splits["train"]) == 100
    assert len(task.labelled.splits["validation"]) == 1281  # evaluation keeps the whole split
    per_epoch = task.steps_per_epoch(adjust_for_packing(config, task.packing_factor()).batch_size)
    length = run_length(config, per_epoch)
    assert length.steps == length.eval_every_steps == per_epoch < 10  # 100 examples: a few steps
    config.train.min_steps, config.eval.evaluations = 50, 4
    length = run_length(config, per_epoch)
    assert length.steps == 50
    assert length.eval_every_steps == length.checkpoint_every_steps == 13  # ceil(50 / 4)
    assert length.warmup_steps == 5  # 10% of the steps actually run
