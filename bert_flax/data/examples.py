"""BERT pre-training examples from tokenized documents (the recipe of Google BERT's
``create_pretraining_data.py``, Devlin et al. 2019), deterministic for a seed.

* Each document is a list of sentences (token ids). Sentences longer than ``max_seq_length - 3``
  are split into pieces at word boundaries first (counted), so no sentence is cut silently.
* Sentences fill chunks up to a target length (``max_seq_length - 3``, or with probability
  ``short_seq_prob`` a random length in [2, max]); a chunk is split at a random point into A and B.
  The target is drawn afresh for every example. (Google's script draws it once per document,
  which for long documents such as speeches makes all or none of a document's examples short;
  per example is what the BERT paper describes: "10% of the time" shorter sequences.)
* Next-sentence prediction: with probability 1/2 (always when the chunk has one sentence) B is
  replaced by text from a random point of another of the given documents (a bucket: see
  stages.py; the same one only if there is no other), and the unused sentences of the chunk are
  put back.
  **Label convention (as Google BERT): 0 = IsNext (B follows A), 1 = random B.**
* A pair longer than ``max_seq_length - 3`` is trimmed one token at a time from a random end of the
  longer side, as in the original; every trimmed token is counted (``truncated_tokens``).
* Masked LM: ``min(max_predictions_per_seq, max(1, round(length * masked_lm_prob)))`` positions
  (so the count scales with the sequence's length), drawn from non-special tokens (whole words with
  ``whole_word_mask``); each is replaced by [MASK] 80%, a random ordinary token 10%, kept 10%.

Randomness: each (dupe pass, document) has its own ``random.Random`` seeded by
``"{seed}:{split}:{dupe}:{document}"``, so the result does not depend on how many processes
share the work.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from bert_flax.input_pipeline.contract import Example


@dataclasses.dataclass(frozen=True)
class ExampleOptions:
    """Knobs of the recipe (defaults as in Google BERT)."""

    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int | None = None  # None: ceil(masked_lm_prob * max_seq_length)
    whole_word_mask: bool = False
    dupe_factor: int = 5

    def __post_init__(self):
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be at least 8, got {self.max_seq_length}.")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}.")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}.")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be >= 1, got {self.dupe_factor}.")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise ValueError("max_predictions_per_seq must be >= 1 (or None to derive it).")

    @property
    def predictions_per_seq(self) -> int:
        if self.max_predictions_per_seq is not None:
            return self.max_predictions_per_seq
        return default_max_predictions(self.max_seq_length, self.masked_lm_prob)


def default_max_predictions(max_seq_length: int, masked_lm_prob: float = 0.15) -> int:
    """ceil(prob * length): 20 at 128, 77 at 512 (Google used 20 and ~76-80)."""
    return int(np.ceil(masked_lm_prob * max_seq_length - 1e-9))


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The options plus what the recipe needs to know of the vocabulary."""

    options: ExampleOptions
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray  # bool [vocab]: the token continues a word ("##...")
    replacement_ids: np.ndarray  # int32: ordinary tokens a masked token may be replaced by


@dataclasses.dataclass
class RecipeStats:
    """Counts that the summary reports."""

    examples: int = 0
    tokens: int = 0
    split_sentences: int = 0
    truncated_tokens: int = 0
    random_next: int = 0
    masked: int = 0
    masked_as_mask: int = 0
    masked_as_random: int = 0
    masked_as_kept: int = 0

    def add(self, other: RecipeStats) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def split_long_sentences(
    document: Sequence[np.ndarray],
    max_tokens: int,
    is_continuation: np.ndarray,
    stats: RecipeStats,
) -> list[np.ndarray]:
    """Pieces of at most ``max_tokens``, cut before a word start where possible."""
    pieces = []
    for sentence in document:
        if len(sentence) <= max_tokens:
            pieces.append(sentence)
            continue
        stats.split_sentences += 1
        start = 0
        while len(sentence) - start > max_tokens:
            end = start + max_tokens
            cut = end
            while cut > start + 1 and is_continuation[sentence[cut]]:
                cut -= 1  # do not cut inside a word unless the word alone is too long
            pieces.append(sentence[start:cut])
            start = cut
        pieces.append(sentence[start:])
    return pieces


def _truncate_pair(
    a: list[int], b: list[int], max_tokens: int, rng: random.Random
) -> tuple[list[int], list[int], int]:
    """Trim the longer side (B on ties) from a random end, one token at a time, until the pair
    fits; returns the trimmed sides and how many tokens were removed."""
    bounds = [[0, len(a)], [0, len(b)]]
    removed = 0
    while (bounds[0][1] - bounds[0][0]) + (bounds[1][1] - bounds[1][0]) > max_tokens:
        side = bounds[0] if bounds[0][1] - bounds[0][0] > bounds[1][1] - bounds[1][0] else bounds[1]
        if rng.random() < 0.5:
            side[0] += 1
        else:
            side[1] -= 1
        removed += 1
    return a[bounds[0][0] : bounds[0][1]], b[bounds[1][0] : bounds[1][1]], removed


def mask_tokens(
    tokens: list[int], rng: random.Random, recipe: Recipe, stats: RecipeStats
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Apply the 80/10/10 masking; returns (masked input ids, positions, original ids).

    Without whole-word masking every candidate is one token, so drawing ``num_to_predict`` of
    them with ``rng.sample`` is the same distribution as Google's shuffle-and-take, and cheaper.
    """
    options = recipe.options
    num_to_predict = min(
        options.predictions_per_seq, max(1, round(len(tokens) * options.masked_lm_prob))
    )
    special = (recipe.cls_id, recipe.sep_id)
    if options.whole_word_mask:
        candidates: list[list[int]] = []
        for i, token in enumerate(tokens):
            if token in special:
                continue
            # A "##" piece joins the word before it, but never across [CLS]/[SEP] (a trimmed
            # side can start mid-word).
            if candidates and recipe.is_continuation[token] and tokens[i - 1] not in special:
                candidates[-1].append(i)
            else:
                candidates.append([i])
        rng.shuffle(candidates)
    else:
        singles = [i for i, token in enumerate(tokens) if token not in special]
        candidates = [[i] for i in rng.sample(singles, min(num_to_predict, len(singles)))]
    output = list(tokens)
    positions: list[int] = []
    for word in candidates:
        if len(positions) >= num_to_predict:
            break
        if len(positions) + len(word) > num_to_predict:
            continue
        for index in word:
            positions.append(index)
            if rng.random() < 0.8:
                output[index] = recipe.mask_id
                stats.masked_as_mask += 1
            elif rng.random() < 0.5:
                stats.masked_as_kept += 1
            else:
                choices = recipe.replacement_ids
                output[index] = int(choices[rng.randint(0, len(choices) - 1)])
                stats.masked_as_random += 1
    positions.sort()
    stats.masked += len(positions)
    return (
        np.asarray(output, dtype=np.int32),
        np.asarray(positions, dtype=np.int32),
        np.asarray([tokens[p] for p in positions], dtype=np.int32),
    )


def examples_from_document(
    documents: Sequence[Sequence[np.ndarray]],
    document_index: int,
    rng: random.Random,
    recipe: Recipe,
    stats: RecipeStats,
) -> list[Example]:
    """All examples of one document for one dupe pass (Google's create_instances_from_document).

    ``documents`` must already have over-long sentences split (``split_long_sentences``).
    """
    options = recipe.options
    document = documents[document_index]
    max_tokens = options.max_seq_length - 3  # [CLS] A [SEP] B [SEP]

    def draw_target_length() -> int:
        if rng.random() < options.short_seq_prob:
            return rng.randint(2, max_tokens)
        return max_tokens

    target_length = draw_target_length()

    examples = []
    chunk: list[np.ndarray] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for sentence in chunk[:a_end] for t in sentence.tolist()]
            tokens_b: list[int] = []
            if len(chunk) == 1 or rng.random() < 0.5:
                label = 1
                target_b = target_length - len(tokens_a)
                other = document_index
                if len(documents) > 1:
                    other = rng.randint(0, len(documents) - 2)
                    other += other >= document_index
                random_document = documents[other]
                for sentence in random_document[rng.randint(0, len(random_document) - 1) :]:
                    tokens_b.extend(sentence.tolist())
                    if len(tokens_b) >= target_b:
                        break
                i -= len(chunk) - a_end  # put the unused sentences back
            else:
                label = 0
                tokens_b = [t for sentence in chunk[a_end:] for t in sentence.tolist()]
            tokens_a, tokens_b, removed = _truncate_pair(tokens_a, tokens_b, max_tokens, rng)
            stats.truncated_tokens += removed
            # Both sides are non-empty: A has >= 1 sentence, B too, and trimming keeps the shorter.
            tokens = [recipe.cls_id, *tokens_a, recipe.sep_id, *tokens_b, recipe.sep_id]
            token_types = np.zeros(len(tokens), dtype=np.int32)
            token_types[len(tokens_a) + 2 :] = 1
            input_ids, positions, labels = mask_tokens(tokens, rng, recipe, stats)
            examples.append(Example(input_ids, token_types, positions, labels, label))
            stats.examples += 1
            stats.tokens += len(tokens)
            stats.random_next += label
            chunk = []
            chunk_length = 0
            target_length = draw_target_length()
        i += 1
    return examples


def document_rng(seed: int, split: str, dupe: int, document_index: int) -> random.Random:
    """The generator of one (dupe pass, document); string seeds hash stably (sha512)."""
    return random.Random(f"{seed}:{split}:{dupe}:{document_index}")
