r"""A token-classification set that installs offline: the sentences of the bundled State of the
Union speeches, tagged by a rule, written in CoNLL-2003 layout (IOB2).

    python -m bert_flax.tasks.token_classification.rule_set --out=workdir/rule_ner
    # train.txt, dev.txt, test.txt: `word tag` a line, a blank line between sentences

Words are runs of letters, digits and inner `'.,-` (a number keeps its separators) or single
punctuation marks. The rule, in order, per word:

- a month name (January .. December; not "May" or "March", mostly verbs) is `B-DATE`;
- a number (digits, with `,` or `.` inside) is `B-NUM`;
- a run of two or more capitalised words (an upper-case letter, then lower-case ones), not
  counting the sentence's first word, is a name: `B-NAME I-NAME ...` (a lone capitalised word
  stays `O`: most are a sentence's first word or a title);
- everything else is `O`.

The tokenizer is uncased, so a model learns names from the words themselves and their context
(the speeches' "United States", "Soviet Union", "Federal Government"), numbers and months from
their forms. Only sentences with an entity and at most 50 words are kept (a third of them),
so entities are about a tenth of the words, not 2%. Speeches split into train, dev and test
by `corpus.split_documents` (whole speeches), so no sentence is in two splits.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence

from absl import app, flags

from bert_flax.data import corpus, tokenization
from bert_flax.tasks.token_classification.reading import Sentence

SPLIT_FRACTIONS = {"validation": 0.1, "test": 0.5}  # of the speeches; test of the held-out ones
FILES = {"train": "train.txt", "validation": "dev.txt", "test": "test.txt"}
MAX_WORDS = 50  # longer sentences are left out (CoNLL-2003's average 14 words, the speeches' 41)
LABEL_NAMES = ("O", "B-DATE", "B-NAME", "B-NUM", "I-NAME")
_WORD = re.compile(r"\w+(?:['.,\-]\w+)*|[^\w\s]")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_CAPITALISED = re.compile(r"[A-Z][a-z]+")
MONTHS = frozenset(
    "January February April June July August September October November December".split()
)


def tag(words: Sequence[str]) -> list[str]:
    """The rule's IOB2 tags of one sentence's words (the module docstring)."""
    tags = ["O"] * len(words)
    run: list[int] = []
    for k, word in enumerate([*words, ""]):
        if k > 0 and _CAPITALISED.fullmatch(word) and word not in MONTHS:
            run.append(k)
            continue
        if len(run) > 1:
            tags[run[0] : run[-1] + 1] = ["B-NAME"] + ["I-NAME"] * (len(run) - 1)
        run = []
        if word in MONTHS:
            tags[k] = "B-DATE"
        elif _NUMBER.fullmatch(word):
            tags[k] = "B-NUM"
    return tags


def sentences(documents: Sequence[corpus.Document], limit: int = 0) -> Iterator[Sentence]:
    """The tagged sentences of `documents` that have an entity and at most `MAX_WORDS` words,
    in order (at most `limit` when > 0)."""
    count = 0
    for document in documents:
        for p, paragraph in enumerate(document.paragraphs):
            for text in tokenization.split_sentences(paragraph):
                words = tuple(_WORD.findall(text))
                tags = tag(words)
                if len(words) > MAX_WORDS or all(t == "O" for t in tags):
                    continue
                yield Sentence(words, tuple(tags), f"{document.id} paragraph {p + 1}")
                count += 1
                if count == limit:
                    return


def split_speeches() -> dict[str, list[corpus.Document]]:
    """The bundled speeches by split (train, validation, test)."""
    documents = corpus.read_documents(corpus.bundled_corpus_dir())
    split = corpus.split_documents(documents, SPLIT_FRACTIONS["validation"])
    held_out = corpus.split_documents(split["validation"], SPLIT_FRACTIONS["test"])
    return {
        "train": split["train"],
        "validation": held_out["train"],
        "test": held_out["validation"],
    }


def write_sets(out: str, limit: int = 0) -> dict[str, int]:
    """train.txt, dev.txt and test.txt under `out`; sentences per file."""
    os.makedirs(out, exist_ok=True)
    counts = {}
    for split, documents in split_speeches().items():
        path = os.path.join(out, FILES[split])
        with open(path, "w", encoding="utf-8") as f:
            counts[path] = 0
            for sentence in sentences(documents, limit):
                for word, label in zip(sentence.words, sentence.labels):
                    f.write(f"{word} {label}\n")
                f.write("\n")
                counts[path] += 1
    return counts


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("out", None, "Folder for train.txt, dev.txt and test.txt.", required=True)
    flags.DEFINE_integer("limit", 0, "> 0: at most this many sentences a file.")


def main(argv: list[str]) -> None:
    del argv
    for path, count in write_sets(FLAGS.out, FLAGS.limit).items():
        print(f"{path}: {count:,} sentences")


if __name__ == "__main__":
    define_flags()
    app.run(main)
