"""TFDS corpora by name, offline: the real registered builders (Wikipedia, which has only a train
split, and C4, which has a validation split) under `tfds.testing.mock_data`, a validation split
carved from train by the folders' split rule, and the errors of names TFDS cannot serve.

`python tests/bert_flax/data/test_data_tfds.py METADATA_DIR NAME DOCUMENTS MODULE ARGS...` runs
`python -m MODULE ARGS...` inside `mock_tfds` (the done-when test's first command)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import runpy
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds

from bert_flax.data import corpus, stages, tokenization
from bert_flax.data.create_pretraining_data import (
    PretrainingDataOptions,
    create_pretraining_data,
    open_corpus,
    run_stages,
)
from bert_flax.data.examples import ExampleOptions
from bert_flax.input_pipeline import records
from tests.paths import ROOT

WIKIPEDIA = "wikipedia/20230601.en"
# The splits the prepared datasets have (TFDS's catalog; the package ships no split metadata).
SPLITS = {WIKIPEDIA: ("train",), "c4/en:3.1.0": ("train", "validation")}


@contextlib.contextmanager
def mock_tfds(metadata_dir: str, name: str, documents: int):
    """`tfds.testing.mock_data` on the real registered builder `name`: its own features and split
    names (`SPLITS`), `documents` random documents a split, as if prepared in `metadata_dir`
    (mock_data then reads that metadata whatever data dir is asked for). mock_data ignores
    slices, so `documents` fit in one read unit."""
    assert documents <= stages.READ_UNIT_DOCUMENTS
    builder = tfds.builder(name, data_dir=metadata_dir)
    if not os.path.isdir(builder.data_dir):
        os.makedirs(builder.data_dir)
        infos = [tfds.core.SplitInfo(s, [documents], num_bytes=0) for s in SPLITS[name]]
        builder.info.set_splits(tfds.core.SplitDict(infos))
        builder.info.write_to_directory(builder.data_dir)
    policy = tfds.testing.MockPolicy.USE_FILES
    with tfds.testing.mock_data(num_examples=documents, policy=policy, data_dir=metadata_dir):
        yield


def read_all(source: stages.Source, size: int | None = None) -> list[tuple[int, str]]:
    units = source.units(size) if size else source.units()
    return [(i, "\n".join(p)) for unit in units for i, p in source.read(*unit)]


def mocked_texts(name: str, split: str) -> list[str]:
    """What mock_data yields for the split, read by TFDS itself (the reference)."""
    dataset = tfds.builder(name).as_dataset(split=split, shuffle_files=False)
    return [item["text"].decode() for item in tfds.as_numpy(dataset)]


def test_wikipedia_by_name_gets_validation_carved_from_train_by_the_folders_rule(tmp_path):
    with mock_tfds(str(tmp_path / "meta"), WIKIPEDIA, 200):
        sources, stats = open_corpus(WIKIPEDIA, tfds_data_dir=str(tmp_path / "any"))
        read = {split: read_all(source) for split, source in sources.items()}
        again = {
            split: read_all(s) for split, s in open_corpus(WIKIPEDIA, tfds_data_dir="x")[0].items()
        }
        texts = mocked_texts(WIKIPEDIA, "train")
    assert stats == {"tfds": "wikipedia/20230601.en/1.0.0", "text_feature": "text",
                     "validation_carved_from_train": 0.05}  # fmt: skip
    assert len(set(texts)) == 200  # distinct documents, so a leak would show
    reference = corpus.split_documents([corpus.Document(t, (t.strip(),)) for t in texts], 0.05)
    for split, documents in reference.items():
        assert [text for _, text in read[split]] == [d.text for d in documents]  # in read order
        assert [i for i, _ in read[split]] == list(range(len(documents)))
        assert sources[split].num_documents == len(documents)
    assert len(read["validation"]) == corpus.validation_count(200, 0.05) == 10
    assert not {t for _, t in read["train"]} & {t for _, t in read["validation"]}
    assert again == read


def test_c4_keeps_its_own_validation_split(tmp_path):
    with mock_tfds(str(tmp_path / "meta"), "c4/en:3.1.0", 30):
        sources, _ = open_corpus("c4/en:3.1.0", tfds_data_dir=str(tmp_path / "any"))
        validation = read_all(sources["validation"])
        texts = mocked_texts("c4/en:3.1.0", "validation")
    assert sources["validation"].carve is None and sources["train"].carve is None
    assert [text for _, text in validation] == [t.strip() for t in texts]


def train_only(tmp_path) -> stages.Source:
    """A real prepared TFDS dataset with only a train split, of 2,500 documents (3 read units)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "docs.txt").write_text("".join(f"Document {i} of many.\n\n" for i in range(2500)))
    return open_corpus(
        str(folder),
        tfds_data_dir=str(tmp_path / "tfds"),
        document_mode="blank_line",
        validation_fraction=0.0,
    )[0]["train"]


def test_a_carve_read_by_any_slices_is_the_same_split(tmp_path):
    """Read by units, and by slices that start inside a unit (997, 1994)."""
    whole = train_only(tmp_path)
    texts = [text for _, text in read_all(whole)]
    sides = stages.carve(whole, 0.05)
    reference = corpus.split_documents([corpus.Document(t, (t,)) for t in texts], 0.05)
    for split, documents in reference.items():
        read = read_all(sides[split])
        assert [text for _, text in read] == [d.id for d in documents]
        assert [i for i, _ in read] == list(range(len(documents)))
        assert read_all(sides[split], size=997) == read
    assert len(sides["validation"].units()) == 3


def test_a_carved_split_on_beam_is_byte_for_byte_the_local_runners(tmp_path):
    pytest.importorskip("apache_beam")
    sources = stages.carve(train_only(tmp_path), 0.05)
    vocab = tokenization.load_vocab()
    recipe = stages.make_recipe(vocab, ExampleOptions(max_seq_length=32, dupe_factor=1))
    written = {}
    for runner in ("local", "DirectRunner"):
        out = tmp_path / runner
        paths = {split: records.shard_paths(str(out), split, 2) for split in sources}
        os.makedirs(out / "work")
        options = PretrainingDataOptions(output_dir=str(out), runner=runner, seed=1,
                                         documents_per_bucket=1000, num_workers=1)  # fmt: skip
        run_stages(options, sources, paths, vocab, recipe, str(out / "work"), progress=False)
        written[runner] = [open(p, "rb").read() for split in sources for p in paths[split]]
    assert written["local"] == written["DirectRunner"] and all(written["local"])


def test_names_tfds_cannot_serve_are_errors_that_say_where_it_looked(tmp_path):
    empty, out = tmp_path / "tfds", tmp_path / "out"
    empty.mkdir()
    options = PretrainingDataOptions(input=WIKIPEDIA, output_dir=str(out), tfds_data_dir=str(empty))
    with pytest.raises(ValueError, match=r"'no_such_corpus/en' is neither a folder \(/.*no_such"):
        create_pretraining_data(dataclasses.replace(options, input="no_such_corpus/en"))
    with pytest.raises(ValueError, match="BuilderConfig xx not found"):
        create_pretraining_data(dataclasses.replace(options, input="c4/xx"))
    with pytest.raises(
        FileNotFoundError, match=f"not prepared in {empty} .*tfds build {WIKIPEDIA}"
    ):
        create_pretraining_data(options)
    with pytest.raises(ValueError, match="no text feature 'body'; its features are title, text"):
        create_pretraining_data(dataclasses.replace(options, text_feature="body"))
    assert not os.listdir(empty) and not out.exists()


def test_the_data_dir_defaults_to_tfds_own(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds_home"))
    with pytest.raises(FileNotFoundError, match=f"not prepared in {tmp_path / 'tfds_home'} "):
        create_pretraining_data(
            PretrainingDataOptions(input=WIKIPEDIA, output_dir=str(tmp_path / "out"))
        )


@pytest.mark.slow(seconds=60)
def test_done_when_a_train_only_tfds_corpus_prepares_and_trains_through_an_evaluation(tmp_path):
    """The README's two commands: mock Wikipedia (train only) prepared by name, then configs/tiny.py
    (shrunk) trained to its first evaluation on the carved validation split."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))  # this checkout's code
    data, workdir = str(tmp_path / "wiki_128"), str(tmp_path / "tiny")
    prepare = [sys.executable, os.path.abspath(__file__), str(tmp_path / "meta"), WIKIPEDIA, "400",
               "bert_flax.data.create_pretraining_data", f"--input={WIKIPEDIA}",
               f"--output_dir={data}", "--max_seq_length=128"]  # fmt: skip
    done = subprocess.run(prepare, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(data, "summary.json")) as f:
        splits = json.load(f)["splits"]
    assert (splits["train"]["documents"], splits["validation"]["documents"]) == (380, 20)
    train = [sys.executable, "-m", "bert_flax.train", "--config=configs/tiny.py",
             f"--workdir={workdir}", f"--config.data.data_dir={data}", "--config.train.steps=2",
             "--config.eval.every_steps=2", "--config.model.num_layers=1",
             "--config.model.hidden_size=32", "--config.model.num_heads=2",
             "--config.model.intermediate_size=64", "--config.train.batch_size=8",
             "--config.eval.batch_size=8", "--config.eval.num_batches=2",
             "--config.schedule.warmup_steps=1", "--config.log.plots=False"]  # fmt: skip
    done = subprocess.run(train, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(workdir, "final_metrics.json")) as f:
        final = json.load(f)
    assert final["step"] == 2 and final["eval"]["masked_lm_accuracy"] >= 0


if __name__ == "__main__":
    metadata_dir, name, documents, module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    with mock_tfds(metadata_dir, name, int(documents)):
        runpy.run_module(module, run_name="__main__", alter_sys=True)
