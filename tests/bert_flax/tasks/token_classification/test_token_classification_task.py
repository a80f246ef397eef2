"""The token-classification task end to end on the bundled rule set written as CoNLL files: the
tiny model learns to beat the all-O baseline; `--predict` and the test split write CoNLL files
whose entity F1 by seqeval is the one reported; packed inference gives each sentence the tags it
gets alone."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from seqeval.metrics import f1_score

from bert_flax.runs import parameters
from bert_flax.tasks import TokenClassificationTask, run_task, task_class
from bert_flax.tasks.token_classification import metrics, predict, rule_set
from bert_flax.tasks.token_classification.reading import read_conll
from bert_flax.train import loop
from configs import conll


def seqeval_f1(path: str) -> float:
    """Entity F1 of a written `word gold predicted` file, by seqeval (its default mode)."""
    golds, found = [[]], [[]]
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                golds.append([]), found.append([])
                continue
            _, gold, predicted = line.split()
            golds[-1].append(gold)
            found[-1].append(predicted)
    golds, found = [g for g in golds if g], [p for p in found if p]
    return f1_score(golds, found)  # seqeval's default: conlleval's entities, the config's


def test_the_command_writes_the_three_files(tmp_path):
    command = [sys.executable, "-m", "bert_flax.tasks.token_classification.rule_set"]
    done = subprocess.run(
        [*command, f"--out={tmp_path}", "--limit=20"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for name in rule_set.FILES.values():
        sentences = read_conll(str(tmp_path / name))
        assert len(sentences) == 20 and f"{tmp_path / name}: 20 sentences" in done.stdout


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rule_ner")
    rule_set.write_sets(str(directory), limit=1000)
    paths = {split: str(directory / name) for split, name in rule_set.FILES.items()}
    for split in ("validation", "test"):  # 300 sentences each
        path = directory / rule_set.FILES[split]
        path.write_text("\n\n".join(path.read_text().split("\n\n")[:300]) + "\n\n")
    return paths


def tiny_config(files):
    config = conll.get_config()
    config.data.update(
        train_file=files["train"],
        validation_file=files["validation"],
        test_file=files["test"],
    )
    config.train.epochs = 3.0
    config.eval.evaluations = 2
    return config


@pytest.mark.slow(seconds=45)
def test_fine_tune_beats_all_o_then_predicts_what_seqeval_scores(files, tmp_path):
    workdir = str(tmp_path / "run")
    final = loop.train_and_evaluate(tiny_config(files), workdir)
    best = final["best"]
    assert best["metric"] == "entity_f1"
    assert final["baseline"] == 0.0  # always O finds no entity
    assert best["value"] > 0.4, best
    assert final["eval"]["token_accuracy"] > 0.9
    # The test split, predicted after training, and written in CoNLL columns seqeval reads.
    assert final["test"]["entity_f1"] == pytest.approx(seqeval_f1(final["test"]["path"]))

    assert run_task(workdir) == "token_classification"  # what --predict dispatches on
    out = str(tmp_path / "dev.predicted")
    summary = task_class("token_classification").predict_file(workdir, files["validation"], out)
    f1 = seqeval_f1(out)
    assert f"entity_f1 {f1:.4f}" in summary
    dev = read_conll(files["validation"], scheme="IOB2")
    assert summary.startswith(f"{len(dev)} sentences -> {out}")
    head = parameters.load_finetuned(workdir)[2]
    assert f1 == pytest.approx(head["eval"]["entity_f1"])  # the same sentences, a separate pass

    unlabelled = tmp_path / "words.txt"
    unlabelled.write_text("".join(f"{w}\n" for w in dev[0].words) + "\n")
    assert "entity_f1" not in predict.predict_file(workdir, str(unlabelled), out)
    lines = [line.split() for line in open(out, encoding="utf-8")]
    assert [line[:2] for line in lines[:-1]] == [[w, "O"] for w in dev[0].words]
    assert lines[-1] == []

    # Exported, transformers' pipeline tags each word's first sub-word as the run tagged it.
    exported = tmp_path / "hf"
    done = subprocess.run(
        [sys.executable, "-m", "bert_flax.convert", f"--from_workdir={workdir}",
         f"--to_hf={exported}"],
        capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert pipeline_tags(str(exported), final["test"]["path"], sentences=40) == 0


def pipeline_tags(model: str, predictions: str, sentences: int) -> int:
    """How many words of the first `sentences` of a `word gold predicted` file transformers'
    token-classification pipeline on `model` tags otherwise (at each word's first sub-word);
    asserts it tagged some entity."""
    import transformers

    tag = transformers.pipeline("token-classification", model=model)
    blocks = open(predictions, encoding="utf-8").read().strip().split("\n\n")[:sentences]
    differ = found = 0
    for block in blocks:
        words, ours = zip(*[(line.split()[0], line.split()[2]) for line in block.splitlines()])
        word_of = tag.tokenizer(list(words), is_split_into_words=True).word_ids()
        firsts = {i for i, w in enumerate(word_of) if w is not None and w != word_of[i - 1]}
        theirs = ["O"] * len(words)
        for entity in tag(" ".join(words)):
            if entity["index"] in firsts:
                theirs[word_of[entity["index"]]] = entity["entity"]
        differ += sum(a != b for a, b in zip(ours, theirs))
        found += sum(t != "O" for t in theirs)
    assert found > 0
    return differ


def test_packed_inference_gives_each_sentence_its_tags_alone(files):
    config = tiny_config(files)
    config.data.rule_sentences = 0
    task = TokenClassificationTask(config)
    model_config = task.model_config()
    params = task.model(model_config).init(
        jax.random.key(0), task.synthetic_batch(2, seed=0), deterministic=True
    )["params"]
    table = task.encoded["validation"]
    options = {"max_seq_length": 128, "max_sequences_per_pack": 16}
    packed = predict.infer(model_config, params, table, 5, rows=4, **options)
    alone = predict.infer(model_config, params, table, 5, packed=False, **options)
    assert sorted(packed) == sorted(alone) == list(range(len(table)))
    assert task.packing_factor() > 3
    for sentence in packed:
        np.testing.assert_array_equal(packed[sentence], alone[sentence])
    assert metrics.OUTSIDE in task.label_names


POS = (
    "EU NNP B-ORG\nrejects VBZ O\nGerman JJ B-MISC\ncall NN O\n\n"
    "Peter NNP B-PER\nBlackburn NNP I-PER\n"
)


def test_pos_tags_are_scored_by_accuracy_and_schemes_convert(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(POS)
    config = conll.get_config()
    config.data.update(train_file=str(path), validation_file=str(path), label_column=1)
    config.data.label_scheme = "none"
    pos = TokenClassificationTask(config)
    assert (pos.eval_metric, pos.label_names) == ("token_accuracy", ["JJ", "NN", "NNP", "VBZ"])
    assert pos.baseline([]) == ("always predicting 'NNP'", 0.5)
    config.data.update(label_column=-1, label_scheme="IOB2", convert_to="BIOES")
    ner = TokenClassificationTask(config)
    assert ner.eval_metric == "entity_f1" and ner.head_config()["label_scheme"] == "BIOES"
    assert [s.labels for s in ner.sentences["validation"]] == [
        ("S-ORG", "O", "S-MISC", "O"),
        ("B-PER", "E-PER"),
    ]


def test_a_bad_conll_file_ends_the_command_as_one_line_with_status_2(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("EU NNP B-ORG\nrejects O\n")
    done = subprocess.run(
        [sys.executable, "-m", "bert_flax.train", "--config=configs/conll.py",
         f"--workdir={tmp_path / 'run'}", f"--config.data.train_file={path}",
         f"--config.data.validation_file={path}"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {path}:2: 2 columns, but the sentence starting at line 1 has 3; give every "
        "line of a sentence the same columns (a word holds no spaces)."
    )
    assert not (tmp_path / "run").exists()


def test_the_tfds_builder_trains_with_its_label_names_or_converted_ones():
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow as tf

    names = list(tfds.builder("conll2003").info.features["ner"].feature.names)
    words, tags = ["EU", "rejects", "German", "call"], ["B-ORG", "O", "B-MISC", "I-MISC"]
    splits = {"train": 3, "dev": 2, "test": 1}

    def as_dataset(builder, split, **kwargs):
        items = [{"tokens": words, "ner": [names.index(t) for t in tags]}] * splits[split]
        spec = {"tokens": tf.TensorSpec([None], tf.string), "ner": tf.TensorSpec([None], tf.int64)}
        return tf.data.Dataset.from_generator(lambda: iter(items), output_signature=spec)

    config = conll.get_config()
    config.data.dataset = "tfds"
    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        task = TokenClassificationTask(config)
        assert task.label_names == names  # the builder's, in its order
        assert {s: len(v) for s, v in task.sentences.items()} == {
            "train": 3,
            "validation": 2,
            "test": 1,
        }
        config.data.convert_to = "BIOES"
        converted = TokenClassificationTask(config)
    assert converted.label_names == ["O", "B-MISC", "E-MISC", "S-ORG"]
    assert converted.sentences["test"][0].labels == ("S-ORG", "O", "B-MISC", "E-MISC")


def test_a_cased_vocabulary_keeps_the_case_of_the_text(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(POS)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join([*special, "EU", "eu", "Peter", "peter", "rejects", "call"]) + "\n")
    config = conll.get_config()
    config.data.update(train_file=str(path), validation_file=str(path), vocab_file=str(vocab))
    cased = TokenClassificationTask(config)
    assert cased.head_config()["lowercase"] is False
    eu, peter = (cased.vocab.tokenizer.token_to_id(w) for w in ("EU", "Peter"))
    assert cased.encoded["train"].ids[:2].tolist() == [cased.vocab.cls_id, eu]
    assert peter in cased.encoded["train"].ids
    vocab.write_text("\n".join([*special, "eu", "peter", "rejects", "call"]) + "\n")
    uncased = TokenClassificationTask(config)
    assert uncased.head_config()["lowercase"] is True
    assert uncased.encoded["train"].ids[1] == uncased.vocab.tokenizer.token_to_id("eu")
