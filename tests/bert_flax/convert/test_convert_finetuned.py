"""Fine-tuned models out to `transformers`: the folder `convert --from_workdir=RUN --to_hf=DIR`
writes loads in `transformers.pipeline`, whose predictions are the project's own (a real tiny
fine-tuning's test labels and probabilities; token classification logits against the Flax
encoder's), and SQuAD answer spans equal those read off the transformers model's logits."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import flax
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_flax.convert import finetuned  # noqa: E402
from bert_flax.data import tokenization  # noqa: E402
from bert_flax.model.bert import BertModel  # noqa: E402
from bert_flax.model.config import BertConfig  # noqa: E402
from bert_flax.runs import parameters  # noqa: E402
from bert_flax.tasks.squad import predict as squad_predict  # noqa: E402
from bert_flax.train import loop  # noqa: E402
from configs import finetune_sentiment  # noqa: E402

SMALL = dict(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
CONFIG = BertConfig.preset("tiny", **SMALL, max_position_embeddings=64, initializer_range=0.3)
GOOD = ["a great film", "a gripping and moving story", "sharp and funny", "one of the best"]
BAD = ["an awful film", "dull and far too long", "the plot goes nowhere", "not worth it"]


def write_csv(path, texts_and_labels) -> str:
    lines = ["text,label"] + [f"{text},{label}" for text, label in texts_and_labels]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    """A classifier fine-tuned for a few steps on `GOOD` and `BAD` (its test split predicted)."""
    directory = tmp_path_factory.mktemp("classifier")
    rows = [(text, "good") for text in GOOD] + [(text, "bad") for text in BAD]
    config = finetune_sentiment.get_config()
    config.model.update(**SMALL, max_position_embeddings=64)
    config.data.update(
        train_file=write_csv(directory / "train.csv", rows * 4),
        validation_file=write_csv(directory / "dev.csv", rows),
        test_file=write_csv(directory / "test.csv", rows),
        max_seq_length=32,
    )
    config.train.update(epochs=1.0, batch_size=8, min_rows_per_step=2)
    config.eval.batch_size = 8
    loop.train_and_evaluate(config, str(directory / "run"))
    return directory / "run"


def convert(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "bert_flax.convert", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def test_a_fine_tuned_classifier_classifies_alike_in_a_transformers_pipeline(
    classifier_run, tmp_path
):
    out = tmp_path / "hf"
    done = convert(f"--from_workdir={classifier_run}", f"--to_hf={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == ["BertForSequenceClassification"]
    assert hf_config["problem_type"] == "single_label_classification"
    assert hf_config["id2label"] == {"0": "bad", "1": "good"}
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True

    classify = transformers.pipeline("text-classification", model=str(out), top_k=None)
    theirs = classify(GOOD + BAD)  # the test split, in file order
    ours = [json.loads(line) for line in open(classifier_run / "predictions_test.jsonl")]
    assert len(ours) == len(theirs) == len(GOOD + BAD)
    for mine, scores in zip(ours, theirs):
        by_label = {s["label"]: s["score"] for s in scores}
        np.testing.assert_allclose([by_label["bad"], by_label["good"]], mine["probabilities"],
                                   atol=1e-5)  # fmt: skip
        if abs(by_label["good"] - by_label["bad"]) > 1e-3:  # a clear prediction
            assert max(by_label, key=by_label.get) == mine["label"]


def test_labels_and_problem_types():
    regression = finetuned.hf_fields({"num_labels": 1, "label_names": None})
    assert regression["problem_type"] == "regression" and regression["num_labels"] == 1
    head = {"task": "classification", "num_labels": 3, "label_names": ["a", "b", "c"]}
    assert finetuned.hf_fields(head)["problem_type"] == "single_label_classification"
    multi = finetuned.hf_fields({**head, "task": "multi_label", "multi_label": True})
    assert multi["problem_type"] == "multi_label_classification"
    assert multi["label2id"] == {"a": 0, "b": 1, "c": 2}
    with pytest.raises(ValueError, match=r"pooling='mean'.*pooling=cls"):
        finetuned.hf_fields({**head, "pooling": "mean"})
    with pytest.raises(ValueError, match="A retrieval run's best/ has no transformers class"):
        finetuned.hf_fields({"task": "retrieval"})


def save_finetuned(workdir, params, head: dict) -> None:
    """A fine-tuning run's `best/` as `BestParams` leaves it."""
    best = workdir / parameters.BEST_DIR
    parameters.save_params(params, CONFIG, str(best))
    (best / parameters.BEST_FILE).write_text(json.dumps(head))


def encoder_params(seed: int) -> dict:
    rows = {name: np.ones((1, 4), np.int32) for name in ("input_ids", "segment_ids")}
    rows |= {name: np.zeros((1, 4), np.int32) for name in ("token_type_ids", "positions")}
    inputs = (rows[k] for k in ("input_ids", "token_type_ids", "positions", "segment_ids"))
    variables = BertModel(CONFIG).init(jax.random.key(seed), *inputs, deterministic=True)
    return flax.linen.unbox(variables)["params"]


def test_a_qa_model_answers_alike_in_transformers(tmp_path):
    vocab = tokenization.default_vocab_path()
    settings = squad_predict.WindowSettings(64, 32, 16, 20, 6)
    params = {"bert": encoder_params(0), "qa_outputs": {
        "kernel": np.random.default_rng(0).normal(0, 1, (32, 2)).astype(np.float32),
        "bias": np.zeros(2, np.float32)}}  # fmt: skip
    head = {"task": "squad", "windows": dataclasses.asdict(settings), "version_2": False,
            "max_sequences_per_pack": 2, "algorithm": "lpfhp", "vocab_file": vocab,
            "lowercase": True}  # fmt: skip
    save_finetuned(tmp_path / "run", params, head)
    config, loaded, head = parameters.load_finetuned(str(tmp_path / "run"))
    finetuned.export_finetuned(loaded, config, head, str(tmp_path / "hf"))

    context = "the old bridge over the river was built by french engineers in the spring of 1889"
    questions = ["who built the bridge", "when was the old bridge built", "what crosses the river"]
    squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": str(i), "question": q, "answers": [{"text": "the", "answer_start": 0}]}
        for i, q in enumerate(questions)]}]}]}  # fmt: skip
    (tmp_path / "dev.json").write_text(json.dumps(squad))
    squad_predict.predict_file(str(tmp_path / "run"), str(tmp_path / "dev.json"),
                               str(tmp_path / "answers.json"))  # fmt: skip
    ours = json.loads((tmp_path / "answers.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "hf").eval()
    for i, question in enumerate(questions):
        assert hf_answer(tokenizer, model, question, context, max_length=6) == ours[str(i)]
    assert len(set(ours.values())) > 1  # not one span for every question


def hf_answer(tokenizer, model, question: str, context: str, max_length: int) -> str:
    """The best span of at most `max_length` context tokens by start + end logit, read from
    a transformers model and tokenizer (what the question-answering pipeline of transformers 4
    did; version 5 has none)."""
    inputs = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets, context_tokens = inputs.pop("offset_mapping")[0], inputs.sequence_ids(0)
    with torch.no_grad():
        out = model(**inputs)
    start, end = out.start_logits[0].numpy(), out.end_logits[0].numpy()
    spans = [
        (start[s] + end[e], s, e)
        for s in range(len(start))
        for e in range(s, min(s + max_length, len(end)))
        if context_tokens[s] == context_tokens[e] == 1
    ]
    _, s, e = max(spans)
    return context[int(offsets[s][0]) : int(offsets[e][1])]


def test_a_token_classifier_gives_the_flax_logits_in_transformers(tmp_path):
    labels = ["O", "B-LOC", "I-LOC", "B-PER"]
    rng = np.random.default_rng(1)
    classifier = {"kernel": rng.normal(0, 1, (32, 4)).astype(np.float32),
                  "bias": rng.normal(0, 0.1, 4).astype(np.float32)}  # fmt: skip
    params = {"bert": encoder_params(1), "classifier": classifier}
    head = {"task": "token_classification", "label_names": labels,
            "vocab_file": tokenization.default_vocab_path()}  # fmt: skip
    save_finetuned(tmp_path / "run", params, head)
    config, loaded, head = parameters.load_finetuned(str(tmp_path / "run"))
    finetuned.export_finetuned(loaded, config, head, str(tmp_path / "hf"))

    sentence = "Ada Lovelace was born in London"
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tokenizer(sentence, return_tensors="np")["input_ids"].astype(np.int32)
    model = transformers.BertForTokenClassification.from_pretrained(
        tmp_path / "hf", attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.from_numpy(ids).long()).logits.numpy()[0]
    zeros, positions = np.zeros_like(ids), np.arange(ids.shape[1], dtype=np.int32)[None]
    hidden = BertModel(CONFIG).apply({"params": params["bert"]}, ids, zeros, positions,
                                     np.ones_like(ids), deterministic=True)  # fmt: skip
    ours = np.asarray(hidden)[0] @ classifier["kernel"] + classifier["bias"]
    np.testing.assert_allclose(theirs, ours, atol=1e-4)
    assert np.abs(ours).max() > 0.5  # not a trivial agreement

    tag = transformers.pipeline("token-classification", model=str(tmp_path / "hf"))
    found = {(e["index"], e["entity"]) for e in tag(sentence)}
    wanted = {(i, labels[k]) for i, k in enumerate(ours.argmax(-1)) if 0 < i < len(ids[0]) - 1}
    assert found == {(i, name) for i, name in wanted if name != "O"}
