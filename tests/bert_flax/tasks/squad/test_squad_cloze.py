"""The cloze set: every question blanks a mention its context holds, from another paragraph of
the same document, and the file reads back through the SQuAD reader."""

import json
import subprocess
import sys

import pytest

from bert_flax.data.corpus import Document
from bert_flax.tasks.squad import cloze, reading
from tests.paths import ROOT

SPEECH = Document(
    "1801-Jefferson.txt",
    (
        "The United States signed a treaty in 1795 with Spain, and trade grew by 1,200 ships.",
        "Congress met in Washington City. The treaty of 1795 opened the river to our boats.",
        "Our ships, some 1,200 of them, carried the trade of the United States abroad.",
        "No number or name here at all.",
    ),
)


def test_each_question_blanks_a_mention_of_its_context_from_elsewhere():
    squad = cloze.build([SPEECH], per_context=5, min_mentions=1)
    paragraphs = squad["data"][0]["paragraphs"]
    assert len(paragraphs) == 3  # the last paragraph mentions nothing
    for paragraph in paragraphs:
        context = paragraph["context"]
        for qa in paragraph["qas"]:
            (answer,) = qa["answers"]
            start = answer["answer_start"]
            assert context[start : start + len(answer["text"])] == answer["text"]
            assert context.index(answer["text"]) == start  # its first occurrence
            assert cloze.BLANK in qa["question"]
            sentence = qa["question"].replace(cloze.BLANK, answer["text"], 1)
            others = [p for p in SPEECH.paragraphs if p != context]
            assert any(sentence in p for p in others) and sentence not in context


def test_only_contexts_with_enough_distinct_mentions_ask():
    """The first paragraph names three ("The United States", 1795, 1,200), two of them found
    elsewhere; the others name two."""
    (paragraph,) = cloze.build([SPEECH], per_context=5)["data"][0]["paragraphs"]
    assert paragraph["context"] == SPEECH.paragraphs[0]
    assert {qa["answers"][0]["text"] for qa in paragraph["qas"]} == {"1795", "1,200"}


def test_the_written_set_reads_as_squad(tmp_path):
    path = tmp_path / "cloze.json"
    path.write_text(json.dumps(cloze.build([SPEECH])))
    examples = reading.read_squad(str(path))
    assert examples and all(e.answers and not e.is_impossible for e in examples)
    assert len({e.id for e in examples}) == len(examples)


def test_documents_that_share_no_mention_are_an_error():
    with pytest.raises(ValueError, match="No cloze question"):
        cloze.build([Document("a", ("Nothing to ask.", "Still nothing."))])


def test_the_command_writes_train_and_dev(tmp_path):
    command = [sys.executable, "-m", "bert_flax.tasks.squad.cloze", f"--out={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("train", "dev"):
        squad = reading.read_squad(str(tmp_path / f"{name}.json"))
        assert f"{name}.json: {len(squad):,} questions" in done.stdout
