"""Example creation: the BERT recipe's invariants and statistics on real text, determinism."""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os

import numpy as np
import pytest

import packing
from bert_flax.data import stages, tokenization
from bert_flax.data.create_pretraining_data import PretrainingDataOptions, create_pretraining_data
from bert_flax.data.examples import ExampleOptions, RecipeStats, split_long_sentences
from bert_flax.input_pipeline import records

CLS, SEP, MASK = 101, 102, 103


@pytest.fixture(scope="module")
def vocab() -> tokenization.Vocab:
    return tokenization.load_vocab()


@pytest.fixture(scope="module")
def table(data_dir):
    return records.read_table(records.find_shards(data_dir, "train"), 128, 20)


def originals(table, i) -> np.ndarray:
    ex = table.example(i)
    tokens = ex.input_ids.copy()
    tokens[ex.masked_lm_positions] = ex.masked_lm_ids
    return tokens


def test_vocab_is_bert_base_uncased(vocab):
    assert vocab.size == 30522
    assert vocab.special_ids() == {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
    ids = tokenization.encode(vocab, ["Unaffable Congress!"])[0]
    assert vocab.tokenizer.decode(ids.tolist()) == "unaffable congress!"
    assert vocab.is_continuation[ids].any()
    assert not np.isin([0, 100, 101, 102, 103, 1], vocab.replacement_ids).any()


def test_sentence_splitter_keeps_abbreviations_and_initials():
    text = (
        "Mr. Speaker, the U.S. Congress met on Jan. 3. It was cold! "
        'John F. Kennedy said "ask not." Then 1960 came? Yes.'
    )
    assert tokenization.split_sentences(text) == [
        "Mr. Speaker, the U.S. Congress met on Jan. 3.",
        "It was cold!",
        'John F. Kennedy said "ask not."',
        "Then 1960 came?",
        "Yes.",
    ]


def test_over_long_sentences_are_split_at_word_starts(vocab):
    ids = tokenization.encode(vocab, ["unaffable " * 40])[0]  # 3 pieces a word
    stats = RecipeStats()
    pieces = split_long_sentences([ids, ids[:5]], 20, vocab.is_continuation, stats)
    assert stats.split_sentences == 1
    assert np.array_equal(np.concatenate(pieces[:-1]), ids)
    assert all(len(p) <= 20 for p in pieces)
    assert all(not vocab.is_continuation[p[0]] for p in pieces)


def test_every_example_follows_the_recipe(table, summary):
    assert len(table) == summary["splits"]["train"]["examples"]
    for i in range(len(table)):
        ex = table.example(i)
        n = len(ex.input_ids)
        tokens = originals(table, i)
        seps = np.flatnonzero(tokens == SEP)
        assert tokens[0] == CLS and len(seps) == 2 and seps[1] == n - 1 and n <= 128
        assert np.array_equal(ex.token_type_ids, (np.arange(n) > seps[0]).astype(np.int32))
        assert seps[0] >= 2 and seps[1] - seps[0] >= 2  # A and B are not empty
        assert len(ex.masked_lm_positions) == min(20, max(1, round(n * 0.15)))
        assert np.all(np.diff(ex.masked_lm_positions) > 0)
        assert not np.isin(tokens[ex.masked_lm_positions], [CLS, SEP]).any()


def test_masking_and_nsp_statistics_on_real_text(table, summary):
    masked = kept = random = total = 0
    tokens = int(table.lengths.sum())
    for i in range(len(table)):
        ex = table.example(i)
        shown = ex.input_ids[ex.masked_lm_positions]
        masked += int((shown == MASK).sum())
        kept += int((shown == ex.masked_lm_ids).sum())
        total += len(shown)
    random = total - masked - kept
    assert total / tokens == pytest.approx(0.15, abs=0.005)
    assert masked / total == pytest.approx(0.8, abs=0.01)
    assert kept / total == pytest.approx(0.1, abs=0.01)
    assert random / total == pytest.approx(0.1, abs=0.01)
    assert table.next_sentence_labels.mean() == pytest.approx(0.5, abs=0.05)
    stats = summary["splits"]["train"]
    assert stats["masked"] == total and stats["masked_as_mask"] == masked
    assert stats["random_next"] == int(table.next_sentence_labels.sum())


def test_short_sequences_are_about_short_seq_prob(table):
    # The target length is shortened with probability 0.1 per example, to a uniform length in
    # [2, 125]; chunks overshoot their target by up to a sentence (~30 tokens here), so about
    # 0.1 * 85 / 124 ~ 7% of examples end up clearly short. Drawing the target once per document
    # (Google's script) gives ~0.5% on these long speeches.
    assert 0.03 < np.mean(table.lengths < 115) < 0.2


def test_whole_word_masking_masks_every_piece_of_a_word(vocab, speeches_dir, tmp_path):
    texts = [open(os.path.join(speeches_dir, n)).read() for n in sorted(os.listdir(speeches_dir))]
    documents = tokenization.tokenize_documents(vocab, [t.split("\n") for t in texts[-3:]])
    options = ExampleOptions(max_seq_length=64, whole_word_mask=True, dupe_factor=1)
    recipe = stages.make_recipe(vocab, options)
    keyed, stats = stages.bucket_examples(enumerate(documents), recipe, seed=0, split="train")
    path = str(tmp_path / "wwm.tfrecord")
    stages.write_shard(path, keyed)
    table = records.read_table([path], 64, options.predictions_per_seq)
    words = 0
    for i in range(len(table)):
        tokens = originals(table, i)
        chosen = set(table.example(i).masked_lm_positions.tolist())
        for p in chosen:
            if p + 1 < len(tokens) and vocab.is_continuation[tokens[p + 1]]:
                assert p + 1 in chosen  # the rest of the word is masked too
                words += 1
            if vocab.is_continuation[tokens[p]] and tokens[p - 1] not in (CLS, SEP):
                assert p - 1 in chosen
    assert words > 50
    assert stats.masked == int(table.num_predictions.sum())


def test_output_is_a_function_of_the_seed_not_of_the_workers(tmp_path, speeches_dir):
    small = tmp_path / "five"
    small.mkdir()
    for name in sorted(os.listdir(speeches_dir))[:5]:
        (small / name).write_bytes((open(os.path.join(speeches_dir, name), "rb")).read())
    options = PretrainingDataOptions(
        input=str(small),
        output_dir=str(tmp_path / "a"),
        max_seq_length=64,
        dupe_factor=2,
        tfds_data_dir=str(tmp_path / "tfds"),
        num_train_shards=2,
        num_workers=1,
    )
    one = create_pretraining_data(options, progress=False)
    two = create_pretraining_data(
        dataclasses.replace(options, output_dir=str(tmp_path / "b"), num_workers=2),
        progress=False,
    )
    create_pretraining_data(
        dataclasses.replace(options, output_dir=str(tmp_path / "c"), num_workers=None, seed=7),
        progress=False,
    )
    names = [
        *one["splits"]["train"]["shards"],
        "validation-00000-of-00001.tfrecord",
        "histogram.txt",
    ]
    for name in names:
        assert filecmp.cmp(tmp_path / "a" / name, tmp_path / "b" / name, shallow=False), name
    load = lambda d: packing.StrategySet.load(str(tmp_path / d / "strategies.json")).strategies
    assert load("a") == load("b")  # the file differs only in solve_seconds
    assert one["splits"]["train"]["examples"] == two["splits"]["train"]["examples"]
    assert not filecmp.cmp(tmp_path / "a" / names[0], tmp_path / "c" / names[0], shallow=False)


def test_summary_histogram_and_strategies_agree_with_the_shards(data_dir, summary, table):
    train = summary["splits"]["train"]
    assert sum(train["examples_per_shard"]) == train["examples"] == len(table)
    assert train["tokens"] == int(table.lengths.sum())
    hist = packing.load_histogram(os.path.join(data_dir, "histogram.txt"))
    assert np.array_equal(hist, packing.from_lengths(table.lengths, 128))
    strategies = packing.StrategySet.load(os.path.join(data_dir, "strategies.json"))
    strategies.check(hist)
    assert strategies.algorithm == "nnlshp"
    assert summary["strategies"]["efficiency"] > train["length"]["padded_efficiency"]
    assert summary["corpus"]["documents"] == 20
    assert summary["next_sentence_labels"] == {"0": "IsNext", "1": "RandomNext"}
    with open(os.path.join(data_dir, "summary.json")) as f:
        assert json.load(f) == summary


def test_a_vocabulary_can_be_trained_from_the_corpus_without_validation(tmp_path, speeches_dir):
    few = tmp_path / "few"
    few.mkdir()
    for name in sorted(os.listdir(speeches_dir))[:3]:
        (few / name).write_bytes(open(os.path.join(speeches_dir, name), "rb").read())
    options = PretrainingDataOptions(
        input=str(few),
        output_dir=str(tmp_path / "out"),
        max_seq_length=64,
        dupe_factor=1,
        train_vocab_size=1500,
        validation_fraction=0.0,
        num_workers=1,
    )
    summary = create_pretraining_data(options, progress=False)
    assert summary["splits"]["validation"]["examples"] == 0
    assert records.existing_shards(str(tmp_path / "out"), "validation") == []
    assert summary["vocab"]["path"] == str(tmp_path / "out" / "vocab.txt")
    assert summary["vocab"]["size"] <= 1500
    assert summary["options"]["train_vocab_size"] == 1500  # what `demo.prepare_data` checks
    assert summary["vocab"]["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    table = records.read_table(records.find_shards(str(tmp_path / "out"), "train"), 64, 10)
    assert np.all(table.input_ids[:, 0] == 2) and table.input_ids.max() < summary["vocab"]["size"]


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"max_seq_length": 4}, "max_seq_length"),
        ({"dupe_factor": 0}, "dupe_factor"),
        ({"masked_lm_prob": 0.0}, "masked_lm_prob"),
        ({"short_seq_prob": 1.5}, "short_seq_prob"),
        ({"max_predictions_per_seq": 0}, "max_predictions_per_seq"),
    ],
)
def test_bad_options_are_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        ExampleOptions(**bad)
