"""Labelled data for packed fine-tuning: splits, samples, truncation, packed rows, batches.

References are independent of the module: the tokenizer's own post-processor adds [CLS]/[SEP],
and Google BERT's truncation loop is re-run as written. Reading files: test_classification_reading.
"""

from __future__ import annotations

import numpy as np
import pytest

from bert_flax.data.tokenization import load_vocab
from bert_flax.input_pipeline import rows as data_rows
from bert_flax.tasks.classification import data as cl

L, D = 128, 8


@pytest.fixture(scope="module")
def vocab():
    return load_vocab()


@pytest.fixture(scope="module")
def encoded(vocab, rotten) -> dict[str, cl.EncodedSplit]:
    return {name: cl.encode_split(vocab, split, L) for name, split in rotten.splits.items()}


# --- splits and samples ---------------------------------------------------------------------------


def test_split_indices_validates_fractions():
    parts = cl.split_indices(10, seed=3, fractions=(0.5, 0.5))
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(10))
    with pytest.raises(ValueError, match="summing to 1"):
        cl.split_indices(10, fractions=(0.8, 0.1))
    with pytest.raises(ValueError, match="empty"):
        cl.split_indices(3, fractions=(0.8, 0.1, 0.1))


def test_a_stratified_sample_keeps_label_shares_and_nests(rotten):
    train = rotten.splits["train"]
    share = np.mean(train.labels == 1)
    previous: set[int] = set()
    for count in (7, 100, 1000, len(train)):
        sample = cl.stratified_sample(train, count, seed=0)
        ids = sample.ids.tolist()
        assert len(ids) == len(set(ids)) == count
        assert set(ids) <= set(train.ids.tolist()) and previous <= set(ids)  # nested in the next
        assert abs(np.sum(sample.labels == 1) - share * count) < 1  # largest remainder
        assert ids == sorted(ids, key=train.ids.tolist().index)  # in the split's order
        by_id = dict(zip(train.ids.tolist(), zip(train.texts, train.labels.tolist())))
        assert all(by_id[i] == (t, label) for i, t, label in zip(ids, sample.texts, sample.labels))
        previous = set(ids)
    other = cl.stratified_sample(train, 100, seed=1)
    assert set(other.ids.tolist()) != set(cl.stratified_sample(train, 100, seed=0).ids.tolist())
    for count in (0, len(train) + 1):
        with pytest.raises(ValueError, match=f"A sample of {count} training examples"):
            cl.stratified_sample(train, count)


# --- encoding and truncation -------------------------------------------------------------------


def google_truncate(a: int, b: int, budget: int) -> tuple[int, int]:
    """Google BERT's _truncate_seq_pair, on lengths."""
    while a + b > budget:
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b


def test_truncated_lengths_match_bert_longest_first():
    grid = np.array([(a, b) for a in range(0, 30) for b in range(0, 30)])
    for budget in (1, 7, 10, 25):
        keep_a, keep_b = cl.truncated_lengths(grid[:, 0], grid[:, 1], budget)
        expected = np.array([google_truncate(a, b, budget) for a, b in grid])
        np.testing.assert_array_equal(np.stack([keep_a, keep_b], axis=1), expected)


def split_pair(split: cl.LabelledSplit, k: int) -> tuple[str, str]:
    return split.texts[k], split.texts_b[k]


def test_encode_split_matches_the_tokenizer_and_counts_truncation(vocab):
    texts = ["A short one.", "a much longer sentence that will not fit in the row at all " * 3]
    texts_b = ["and its pair", "b"]
    split = cl.LabelledSplit(texts, texts_b, np.array([0, 1], np.int32), np.array([4, 9], np.int32))
    full = cl.encode_split(vocab, split, L)
    assert full.truncated == 0
    for i, (a, b) in enumerate(zip(texts, texts_b)):
        reference = vocab.tokenizer.encode(a, b)  # [CLS] a [SEP] b [SEP] by the post-processor
        window = slice(full.offsets[i], full.offsets[i + 1])
        assert full.input_ids[window].tolist() == reference.ids
        assert full.token_type_ids[window].tolist() == reference.type_ids

    short = cl.encode_split(vocab, split, 16)
    assert short.truncated == 1 and short.lengths.max() == 16
    assert short.lengths[0] == full.lengths[0]  # the short example is untouched
    a, b = (vocab.tokenizer.encode(t, add_special_tokens=False).ids for t in split_pair(split, 1))
    kept = short.input_ids[short.offsets[1] : short.offsets[2]].tolist()
    keep_a, keep_b = google_truncate(len(a), len(b), 16 - 3)
    assert kept == [vocab.cls_id, *a[:keep_a], vocab.sep_id, *b[:keep_b], vocab.sep_id]

    single = cl.encode_split(vocab, cl.LabelledSplit(texts, None, split.labels, split.ids), 5)
    assert single.truncated == 2 and single.lengths.tolist() == [5, 5]
    assert not single.token_type_ids.any()


# --- packed rows -------------------------------------------------------------------------------


def check_rows(rows: dict, encoded: cl.EncodedSplit, labelled: cl.LabelledSplit, vocab) -> list:
    """Every real slot of ``rows`` holds its example as the tokenizer encodes it; returns the
    example ids seen, in order."""
    index = {int(i): k for k, i in enumerate(labelled.ids)}
    seen = []
    for r in range(len(rows["input_ids"])):
        segments = rows["segment_ids"][r]
        real = int(rows["sequence_mask"][r].sum())
        assert rows["sequence_mask"][r].tolist() == [1.0] * real + [0.0] * (
            len(rows["sequence_mask"][r]) - real
        )
        assert set(np.unique(segments).tolist()) - {0} == set(range(1, real + 1))
        assert not rows["input_ids"][r][segments == 0].any()
        for slot in range(len(rows["example_ids"][r])):
            example_id = int(rows["example_ids"][r][slot])
            if slot >= real:
                assert example_id == -1 and rows["labels"][r][slot] == 0
                assert rows["cls_positions"][r][slot] == 0
                continue
            k = index[example_id]
            mine = np.flatnonzero(segments == slot + 1)
            assert np.array_equal(mine, np.arange(mine[0], mine[0] + len(mine)))  # contiguous
            reference = (
                vocab.tokenizer.encode(labelled.texts[k])
                if labelled.texts_b is None
                else vocab.tokenizer.encode(labelled.texts[k], labelled.texts_b[k])
            )
            assert rows["input_ids"][r][mine].tolist() == reference.ids
            assert rows["token_type_ids"][r][mine].tolist() == reference.type_ids
            assert rows["positions"][r][mine].tolist() == list(range(len(mine)))
            cls = rows["cls_positions"][r][slot]
            assert cls == mine[0] and rows["input_ids"][r][cls] == 101
            assert rows["labels"][r][slot] == labelled.labels[k]
            seen.append(example_id)
    return seen


def test_packed_batches_hold_every_example_once(vocab, rotten, encoded):
    labelled, enc = rotten.splits["validation"], encoded["validation"]
    batches = list(
        data_rows.batches(
            enc, batch_size=16, max_seq_length=L, max_sequences_per_pack=D, pad_final=True
        )
    )
    assert all(b["input_ids"].shape == (16, L) and b["labels"].shape == (16, D) for b in batches)
    seen = [i for b in batches for i in check_rows(b, enc, labelled, vocab)]
    assert sorted(seen) == sorted(labelled.ids.tolist())


def test_packed_and_padded_batches_carry_the_same_examples(rotten, encoded):
    enc = encoded["test"]
    kwargs = dict(batch_size=32, max_seq_length=L, max_sequences_per_pack=D, pad_final=True)
    packed = list(data_rows.batches(enc, packed=True, **kwargs))
    padded = list(data_rows.batches(enc, packed=False, **kwargs))
    assert padded[0]["example_ids"].shape == (32, 1)
    ids = [np.concatenate([b["example_ids"].ravel() for b in bs]) for bs in (packed, padded)]
    ids = [np.sort(i[i >= 0]) for i in ids]
    np.testing.assert_array_equal(ids[0], ids[1])
    np.testing.assert_array_equal(ids[0], np.sort(rotten.splits["test"].ids))
    tokens = [sum(int((b["segment_ids"] > 0).sum()) for b in bs) for bs in (packed, padded)]
    assert tokens[0] == tokens[1] == enc.lengths.sum()
    assert len(packed) < len(padded) / 2


def test_packing_factor_on_rotten_tomatoes(encoded):
    lengths = encoded["train"].lengths
    print(
        f"rotten tomatoes train at L={L}: {len(lengths)} examples, length median "
        f"{np.median(lengths):.0f}, max {lengths.max()}, truncated {encoded['train'].truncated}"
    )
    for algorithm, depth in (("lpfhp", D), ("spfhp", D), ("nnlshp", 3)):
        packs = data_rows.pack_examples(lengths, L, depth, algorithm=algorithm, seed=0)
        flat = np.concatenate(packs)
        assert np.array_equal(np.sort(flat), np.arange(len(lengths)))  # each example once
        assert max(len(p) for p in packs) <= depth
        assert max(lengths[p].sum() for p in packs) <= L
        factor = data_rows.packing_factor(packs)
        assert factor == pytest.approx(len(lengths) / len(packs))
        print(f"  {algorithm} D={depth}: {len(packs)} rows, packing factor {factor:.2f}")
        if depth == D:
            assert factor > 2


def test_padded_packs_are_a_seeded_permutation():
    lengths = np.array([3, 5, 2, 7])
    packs = data_rows.pack_examples(lengths, 8, 4, packed=False, seed=1)
    assert sorted(p[0] for p in packs) == [0, 1, 2, 3] and all(len(p) == 1 for p in packs)
    assert packs == data_rows.pack_examples(lengths, 8, 4, packed=False, seed=1)


def test_epochs_hosts_and_remainders(encoded):
    enc = encoded["validation"]
    kwargs = dict(batch_size=8, max_seq_length=L, max_sequences_per_pack=D)
    ids = lambda bs: np.concatenate([b["example_ids"].ravel() for b in bs])
    epoch0, epoch1 = (list(data_rows.batches(enc, epoch=e, **kwargs)) for e in (0, 1))
    assert not np.array_equal(ids(epoch0), ids(epoch1))
    assert np.array_equal(ids(epoch0), ids(data_rows.batches(enc, epoch=0, **kwargs)))
    fixed = [ids(data_rows.batches(enc, epoch=e, shuffle=False, **kwargs)) for e in (0, 3)]
    assert np.array_equal(fixed[0], fixed[1])
    in_order = ids(data_rows.batches(enc, epoch=2, shuffle=False, packed=False, **kwargs))
    np.testing.assert_array_equal(in_order, enc.ids[: len(in_order)])

    rows = len(data_rows.pack_examples(enc.lengths, L, D, seed=data_rows.epoch_seed(0, 0)))
    assert len(epoch0) == rows // 8  # the partial batch is dropped
    seen = ids(epoch0)
    assert len(set(seen[seen >= 0].tolist())) == (seen >= 0).sum()

    hosts = [
        list(data_rows.batches(enc, process_index=p, process_count=3, **kwargs)) for p in range(3)
    ]
    assert len({len(h) for h in hosts}) == 1 and len(hosts[0]) == rows // 3 // 8
    evaluation = [
        list(data_rows.batches(enc, process_index=p, process_count=3, pad_final=True, **kwargs))
        for p in range(3)
    ]
    assert len({len(h) for h in evaluation}) == 1
    everything = np.concatenate([ids(h) for h in evaluation])
    np.testing.assert_array_equal(np.sort(everything[everything >= 0]), np.sort(enc.ids))
    with pytest.raises(ValueError, match="no full batch"):
        list(data_rows.batches(enc, **{**kwargs, "batch_size": 10_000}))


def test_regression_rows_carry_float_labels(vocab):
    targets = np.arange(6, dtype=np.float32) / 4
    split = cl.LabelledSplit([f"sentence {i}" for i in range(6)], None, targets, np.arange(6))
    enc = cl.encode_split(vocab, split, 32)
    (batch,) = data_rows.batches(enc, batch_size=1, max_seq_length=32, max_sequences_per_pack=8)
    assert batch["labels"].dtype == np.float32
    real = batch["sequence_mask"][0] > 0
    assert sorted(batch["labels"][0][real].tolist()) == targets.tolist()
