r"""A real-text question-answering set that installs offline: cloze questions over the bundled
State of the Union speeches, written as a SQuAD v1.1 file.

    python -m bert_flax.tasks.squad.cloze --out=workdir/cloze   # train.json and dev.json

The construction follows Hermann et al. (2015), who blanked an entity of a summary sentence and
asked for it in the article: here the context is a paragraph of a speech, and a question is a
sentence from *another* paragraph of the same speech that mentions a name (a run of capitalised
words), a year or a number the context also mentions, with that mention replaced by "_____".
The answer is the mention's first occurrence in the context. Only contexts that mention at least
`min_mentions` (3) distinct names and numbers ask questions, so picking a name or number is not
enough: a model must match the question's words around the blank to the context's (the question
sentence is never in the context), then pick the right one of the context's mentions. Speeches
split between train and dev by `corpus.split_documents` (whole documents, so no context is in both).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence

import numpy as np
from absl import app, flags

from bert_flax.data import corpus
from bert_flax.tasks.squad.reading import Example, parse_squad

BLANK = "_____"
VALIDATION_FRACTION = 0.1  # of the speeches, for dev.json
# A name: two or more capitalised words (a lone one is mostly a sentence's first word); a year;
# a number of two or more digits (with thousands separators).
_MENTION = re.compile(
    r"\b(?:[A-Z][a-z]+(?: [A-Z][a-z]+)+|1[6-9]\d\d|20\d\d|\d{1,3}(?:,\d{3})+|\d{2,})\b"
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def mentions(text: str) -> list[re.Match]:
    return list(_MENTION.finditer(text))


def split_sentences(paragraph: str) -> list[str]:
    """The paragraph's sentences (split after . ! or ? before a capital)."""
    return _SENTENCE.split(paragraph)


def cloze_questions(
    document: corpus.Document,
    max_context_chars: int,
    rng: np.random.Generator,
    per_context: int,
    min_mentions: int,
) -> Iterator[dict]:
    """SQuAD "paragraphs" entries of one speech: a context, and cloze questions from its other
    paragraphs."""
    paragraphs = list(document.paragraphs)
    sentences = [
        (i, s, {m.group() for m in mentions(s)})
        for i, p in enumerate(paragraphs)
        for s in split_sentences(p)
    ]
    for c, context in enumerate(paragraphs):
        if len(context) > max_context_chars:
            continue
        first = {}
        for m in mentions(context):
            first.setdefault(m.group(), m.start())
        if len(first) < min_mentions:
            continue
        candidates = [
            (sentence, mention)
            for i, sentence, named in sentences
            if i != c
            for mention in sorted(named & set(first))
        ]
        if not candidates:
            continue
        qas = []
        for k in rng.permutation(len(candidates))[:per_context]:
            sentence, mention = candidates[k]
            qas.append({
                "id": f"{document.id}#{c}.{len(qas)}",
                "question": sentence.replace(mention, BLANK, 1),
                "answers": [{"text": mention, "answer_start": first[mention]}],
            })  # fmt: skip
        yield {"context": context, "qas": qas}


def build(
    documents: Sequence[corpus.Document],
    *,
    max_context_chars: int = 1200,
    per_context: int = 4,
    min_mentions: int = 3,
    seed: int = 0,
) -> dict:
    """A SQuAD v1.1 dict of `documents`' cloze questions (one article per speech)."""
    rng = np.random.default_rng(seed)
    data = []
    for document in documents:
        paragraphs = list(
            cloze_questions(document, max_context_chars, rng, per_context, min_mentions)
        )
        if paragraphs:
            data.append({"title": document.id, "paragraphs": paragraphs})
    if not data:
        raise ValueError("No cloze question found: the documents share no names or numbers.")
    return {"version": "1.1", "data": data}


def examples(documents: Sequence[corpus.Document], seed: int = 0) -> list[Example]:
    """The cloze questions of `documents`, as a SQuAD file of them reads."""
    return parse_squad(build(documents, seed=seed), "the cloze set")


def write_sets(
    out: str, validation_fraction: float = VALIDATION_FRACTION, seed: int = 0
) -> dict[str, int]:
    """train.json and dev.json under `out` from the bundled speeches; questions per file."""
    documents = corpus.read_documents(corpus.bundled_corpus_dir())
    split = corpus.split_documents(documents, validation_fraction)
    os.makedirs(out, exist_ok=True)
    counts = {}
    for name, part in (("train", split["train"]), ("dev", split["validation"])):
        squad = build(part, seed=seed)
        with open(os.path.join(out, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(squad, f)
        counts[name] = sum(len(p["qas"]) for a in squad["data"] for p in a["paragraphs"])
    return counts


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("out", None, "Folder for train.json and dev.json.", required=True)
    flags.DEFINE_integer("seed", 0, "Which cloze questions each context gets.")


def main(argv: list[str]) -> None:
    del argv
    for name, count in write_sets(FLAGS.out, seed=FLAGS.seed).items():
        print(f"{os.path.join(FLAGS.out, name + '.json')}: {count:,} questions")


if __name__ == "__main__":
    define_flags()
    app.run(main)
