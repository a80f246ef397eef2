"""The SQuAD task end to end: fine-tuning on v1.1 and v2.0 files scores EM/F1 through the
evaluation hook, `--predict` writes `predictions.json` whose scores equal the best evaluation's,
and packed inference gives every window the logits it gets alone."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from bert_flax.data import corpus, tokenization
from bert_flax.runs import parameters
from bert_flax.tasks import TASKS, SquadTask, run_task, task_class
from bert_flax.tasks.squad import cloze, predict
from bert_flax.tasks.squad.model import BertForQuestionAnswering
from bert_flax.tasks.squad.reading import read_squad
from bert_flax.train import loop
from configs import squad as squad_config

SPEECHES = slice(0, 40, 10)  # four speeches, spread over the centuries


def write_cloze(path, documents, questions: int, impossible_every: int = 0) -> str:
    """The first `questions` cloze questions of `documents` as a SQuAD file; with
    `impossible_every`, every such question becomes unanswerable (a v2.0 file)."""
    squad = cloze.build(documents)
    kept = 0
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            paragraph["qas"] = paragraph["qas"][: max(questions - kept, 0)]
            for qa in paragraph["qas"]:
                kept += 1
                if impossible_every and kept % impossible_every == 0:
                    qa.update(answers=[], is_impossible=True)
    if impossible_every:
        squad["version"] = "v2.0"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(squad, f)
    return str(path)


def tiny_config(train_file: str, validation_file: str):
    config = squad_config.get_config("cpu")
    config.model.update(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
    config.data.update(
        train_file=train_file,
        validation_file=validation_file,
        max_seq_length=128,
        doc_stride=48,
        max_query_length=32,
    )
    config.train.update(epochs=1.0, batch_size=8, min_rows_per_step=2)
    config.eval.batch_size = 8
    return config


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("squad")
    documents = corpus.read_documents(corpus.bundled_corpus_dir())[SPEECHES]
    train, dev = documents[:3], documents[3:]
    return {
        "v1": (
            write_cloze(directory / "train.json", train, 48),
            write_cloze(directory / "dev.json", dev, 24),
        ),
        "v2": (
            write_cloze(directory / "train-v2.json", train, 48, impossible_every=3),
            write_cloze(directory / "dev-v2.json", dev, 24, impossible_every=3),
        ),
    }


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_fine_tune_then_predict_writes_the_answers_the_evaluation_scored(files, tmp_path, version):
    train_file, dev_file = files[version]
    workdir = str(tmp_path / "run")
    final = loop.train_and_evaluate(tiny_config(train_file, dev_file), workdir)
    assert final["best"]["metric"] == "f1"
    evaluation = final["eval"]
    assert {"exact_match", "f1", "qa_loss"} <= set(evaluation)  # from the task's hook
    assert ("null_threshold" in evaluation) == (version == "v2")

    assert run_task(workdir) == "squad"  # what --predict dispatches on
    out = tmp_path / "predictions.json"
    predict_file = task_class("squad").predict_file
    summary = predict_file(workdir, dev_file, str(out))
    answers = json.loads(out.read_text())
    examples = read_squad(dev_file)
    assert sorted(answers) == sorted(e.id for e in examples)
    contexts = {e.id: e.context for e in examples}
    assert all(text in contexts[q] for q, text in answers.items())  # spans of its own context
    # The best parameters on the same file: the best evaluation's scores, from a separate pass.
    best = parameters.load_finetuned(workdir)[2]["eval"]
    assert f"f1 {best['f1']:.2f}" in summary and f"exact_match {best['exact_match']:.2f}" in summary
    if version == "v2":  # --null_threshold: abstain never, or always
        for threshold, abstains in ((1e9, 0), (-1e9, len(examples))):
            predict_file(workdir, dev_file, str(out), null_threshold=threshold)
            answers = json.loads(out.read_text())
            assert sum(text == "" for text in answers.values()) == abstains


def test_packed_inference_gives_each_window_its_logits_alone(files):
    train_file, _ = files["v1"]
    config = tiny_config(train_file, train_file)
    qa = predict.QASet.build(
        read_squad(train_file)[:12],
        tokenization.load_vocab(),
        predict.WindowSettings(max_seq_length=128, doc_stride=48, max_query_length=32),
    )
    task = SquadTask(config)
    model_config = task.model_config()
    params = BertForQuestionAnswering(model_config).init(
        jax.random.key(0), task.synthetic_batch(2, seed=0), deterministic=True
    )["params"]
    packed = predict.infer(model_config, params, qa, max_sequences_per_pack=3, rows=4)
    alone = predict.infer(model_config, params, qa, max_sequences_per_pack=1, packed=False)
    assert sorted(packed) == sorted(alone) == list(range(len(qa.windows)))
    assert len(qa.windows) > 12  # some questions span several windows
    for window in packed:
        for got, want in zip(packed[window], alone[window]):
            assert got.shape == (len(qa.windows[window].input_ids),)
            np.testing.assert_allclose(got, want, atol=2e-5)


def test_the_registry_names_every_task_and_rejects_an_unknown_one():
    assert sorted(TASKS) == [
        "classification", "glue", "multi_label", "pretraining", "squad", "token_classification",
    ]  # fmt: skip
    assert task_class("squad") is SquadTask
    with pytest.raises(ValueError, match=r"config.task='qa' is not one of \['classification'"):
        task_class("qa")
