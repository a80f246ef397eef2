"""The stages of create_pretraining_data: buckets, keys, the spill-and-sort shuffle, streamed
reading, and NSP's random next sentence staying inside its bucket."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_flax.data import stages, tokenization
from bert_flax.data.create_pretraining_data import (
    PretrainingDataOptions,
    create_pretraining_data,
    open_corpus,
)
from bert_flax.input_pipeline import records


@pytest.mark.parametrize("per_bucket", [2, 3, 10])
@pytest.mark.parametrize("num_documents", [1, 2, 9, 10, 31])
def test_buckets_are_consecutive_runs_of_bounded_size(num_documents, per_bucket):
    buckets = [stages.bucket_of(i, num_documents, per_bucket) for i in range(num_documents)]
    assert buckets == sorted(buckets) and buckets[0] == 0
    sizes = list(collections.Counter(buckets).values())
    assert len(sizes) == max(1, num_documents // per_bucket)
    if num_documents >= per_bucket:
        assert min(sizes) >= per_bucket and max(sizes) <= 2 * per_bucket - 1
    with pytest.raises(ValueError, match="documents_per_bucket"):
        stages.bucket_of(0, 10, 1)


def test_example_keys_are_a_function_of_their_origin():
    keys = {
        stages.example_key(7, "train", d, o, k)
        for d in range(2)
        for o in range(50)
        for k in range(9)
    }
    assert len(keys) == 2 * 50 * 9  # distinct
    assert stages.example_key(7, "train", 1, 2, 3) == stages.example_key(7, "train", 1, 2, 3)
    assert stages.example_key(7, "train", 1, 2, 3) != stages.example_key(8, "train", 1, 2, 3)


def keyed_records(count: int, seed: int = 0) -> list[stages.KeyedRecord]:
    rng = np.random.default_rng(seed)
    return [
        stages.KeyedRecord(
            key=int(rng.integers(0, 2**63)) * 2 + 1,
            serialized=rng.bytes(int(rng.integers(1, 300))),
            length=int(rng.integers(2, 512)),
            num_predictions=int(rng.integers(0, 77)),
        )
        for _ in range(count)
    ]


def test_spill_gives_back_each_shard_exactly_what_was_appended(tmp_path):
    written = keyed_records(500)
    paths = [str(tmp_path / f"{k}.spill") for k in range(7)]
    spill = stages.Spill(paths, buffer_bytes=4096)  # flushed many times
    for record in written:
        spill.append(record)
    for shard in range(7):
        mine = [r for r in written if r.key % 7 == shard]
        assert spill.bytes[shard] == sum(18 + len(r.serialized) for r in mine)
        assert spill.read_and_remove(shard) == mine
        assert not os.path.exists(paths[shard])


def test_a_shard_is_written_in_key_order_and_described_as_written(tmp_path):
    keyed = keyed_records(200)
    path = str(tmp_path / "train-00000-of-00001.tfrecord")
    meta = stages.write_shard(path, keyed[::-1])
    ordered = sorted(keyed, key=lambda r: r.key)
    read_back = [bytes(r) for r in tf.data.TFRecordDataset(path).as_numpy_iterator()]
    assert read_back == [r.serialized for r in ordered]
    assert meta.sizes.tolist() == [len(r.serialized) for r in ordered]
    assert meta.lengths.tolist() == [r.length for r in ordered]
    assert meta.num_predictions.tolist() == [r.num_predictions for r in ordered]
    meta.save(str(tmp_path / "meta.npz"))
    again = stages.ShardMeta.load(str(tmp_path / "meta.npz"))
    assert all(np.array_equal(getattr(again, f), getattr(meta, f)) for f in ("sizes", "lengths"))


def test_a_split_read_in_units_is_the_split(tmp_path, speeches_dir):
    sources, _ = open_corpus(speeches_dir, tfds_data_dir=str(tmp_path / "tfds"))
    source = sources["train"]
    whole = list(source.read(0, source.num_documents))
    units = source.units(size=3)
    assert units[0] == (0, 3) and units[-1][1] == source.num_documents
    assert [doc for unit in units for doc in source.read(*unit)] == whole
    assert [ordinal for ordinal, _ in whole] == list(range(source.num_documents))


WORDS = ["apple", "river", "castle", "music", "winter", "garden", "silver", "doctor", "island"]


def test_random_next_sentences_come_from_the_same_bucket(tmp_path):
    """Each document repeats one word, so an example's words name the documents it drew from."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for word in WORDS:
        sentence = " ".join([word.capitalize()] + [word] * 5) + "."
        (folder / f"{word}.txt").write_text("\n".join([sentence] * 40))
    out = str(tmp_path / "out")
    tfds_dir = str(tmp_path / "tfds")
    options = PretrainingDataOptions(
        input=str(folder),
        output_dir=out,
        max_seq_length=32,
        dupe_factor=2,
        validation_fraction=0.0,
        documents_per_bucket=3,
        num_train_shards=2,
        num_workers=1,
        tfds_data_dir=tfds_dir,
    )
    create_pretraining_data(options, progress=False)
    source = open_corpus(str(folder), tfds_data_dir=tfds_dir, validation_fraction=0.0)[0]["train"]
    vocab = tokenization.load_vocab()
    word_of = {int(tokenization.encode(vocab, [w])[0][0]): w for w in WORDS}
    bucket_of = {
        paragraphs[0].split()[0].lower(): stages.bucket_of(ordinal, len(WORDS), 3)
        for ordinal, paragraphs in source.read(0, source.num_documents)
    }
    table = records.read_table(records.find_shards(out, "train"), 32, 5)
    mixed = 0
    for i in range(len(table)):
        example = table.example(i)
        original = example.input_ids.copy()
        original[example.masked_lm_positions] = example.masked_lm_ids
        words = {word_of[t] for t in original.tolist() if t in word_of}
        assert len({bucket_of[w] for w in words}) == 1, words
        mixed += len(words) > 1
    assert mixed > 0.2 * len(table)  # random next sentences were drawn (from other documents)
