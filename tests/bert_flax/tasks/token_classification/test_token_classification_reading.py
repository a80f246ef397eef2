"""CoNLL files and the TFDS builder to sentences; bad input named with its file, line and fix,
ending a command with one line and exit status 2."""

import pytest

from bert_flax import errors
from bert_flax.tasks.token_classification import reading
from bert_flax.tasks.token_classification.predict import read_for_model

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""
HEAD = {"label_column": -1, "file_scheme": "IOB2", "label_scheme": "IOB2"}


def write(tmp_path, text, name="data.txt"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def user_error(error: BaseException) -> str:
    """The line a command ends with on `error` (asserting exit status 2)."""
    status, line = errors.outcome(error)
    assert status == errors.USER_ERROR_EXIT_STATUS
    return line


def test_a_conll_file_reads_as_sentences_of_the_chosen_column(tmp_path):
    path = write(tmp_path, CONLL)
    sentences = reading.read_conll(path, scheme="IOB2")
    assert [s.words for s in sentences] == [
        ("EU", "rejects", "German", "call"),
        ("Peter", "Blackburn"),
    ]
    assert sentences[0].labels == ("B-ORG", "O", "B-MISC", "O")
    assert sentences[1].at() == f"{path}:8" and sentences[1].at(1) == f"{path}:9"
    chunks = reading.read_conll(path, label_column=2, scheme="IOB2")
    assert chunks[1].labels == ("B-NP", "I-NP")
    pos = reading.read_conll(path, label_column=1)
    assert pos[0].labels == ("NNP", "VBZ", "JJ", "NN")


def test_a_file_of_words_alone_is_unlabelled(tmp_path):
    path = write(tmp_path, "Hello\nworld\n\n\nAgain\n")
    sentences = reading.read_conll(path, scheme="IOB2")
    assert [(s.words, s.labels) for s in sentences] == [
        (("Hello", "world"), None),
        (("Again",), None),
    ]


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "EU NNP B-ORG\nrejects O\n",
            r"data.txt:2: 2 columns, but the sentence starting at line 1 has 3",
        ),
        ("", r"data.txt holds no sentences"),
        ("-DOCSTART- O\n\n\n", r"holds no sentences"),
        ("EU B-ORG\n\nPeter\n", r"data.txt:3: a sentence without labels in a labelled file"),
        ("EU B-ORG\nrejects E-ORG\n", r"data.txt:2: label 'E-ORG' is not a IOB2 tag"),
    ],
)
def test_a_bad_file_is_named_with_its_line_and_fix(tmp_path, text, match):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=match) as caught:
        reading.read_conll(path, scheme="IOB2")
    assert user_error(caught.value) == f"error: {caught.value}"


def test_a_missing_file_a_bad_encoding_and_a_bad_label_column_are_user_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as caught:
        reading.read_conll(str(tmp_path / "nope.txt"))
    assert "nope.txt" in user_error(caught.value)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Müller B-PER\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.txt is not UTF-8 text .* iconv") as caught:
        reading.read_conll(str(latin))
    assert user_error(caught.value) == f"error: {caught.value}"
    with pytest.raises(ValueError, match=r"label_column=3 is not a label column of lines of 3"):
        reading.read_conll(write(tmp_path, "EU NNP B-ORG\n"), label_column=3)


def test_a_label_training_never_saw_is_named_at_prediction(tmp_path):
    path = write(tmp_path, "EU B-ORG\nrejects O\n\nPeter B-PER\n")
    head = {**HEAD, "label_names": ["O", "B-ORG", "I-ORG"]}
    with pytest.raises(ValueError, match=r"data.txt:4: label 'B-PER' was never seen") as caught:
        read_for_model(path, head)
    assert "B-PER" in user_error(caught.value)
    converted = read_for_model(
        path, {**head, "label_scheme": "BIOES", "label_names": ["O", "S-ORG", "S-PER"]}
    )
    assert [s.labels for s in converted] == [("S-ORG", "O"), ("S-PER",)]


def test_the_tfds_builder_reads_as_sentences_with_its_label_names():
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow as tf

    names = list(tfds.builder("conll2003").info.features["ner"].feature.names)
    rows = [
        (["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]),
        ([], []),
        (["Peter"], ["B-PER"]),
    ]

    def as_dataset(builder, split, **kwargs):
        assert builder.name == "conll2003" and split == "dev"
        items = [{"tokens": w, "ner": [names.index(x) for x in t]} for w, t in rows]
        signature = {
            "tokens": tf.TensorSpec([None], tf.string),
            "ner": tf.TensorSpec([None], tf.int64),
        }
        return tf.data.Dataset.from_generator(lambda: iter(items), output_signature=signature)

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        sentences, got = reading.read_tfds("conll2003", "dev", "ner")
    assert got == names and names[:3] == ["O", "B-PER", "I-PER"]
    assert [(s.words, s.labels) for s in sentences] == [
        (("EU", "rejects", "German"), ("B-ORG", "O", "B-MISC")),
        (("Peter",), ("B-PER",)),
    ]  # the empty sentence is left out
    with tfds.testing.mock_data(num_examples=4), pytest.raises(ValueError, match="tokens but"):
        reading.read_tfds("conll2003", "train", "ner")  # random lengths: tokens and tags differ
