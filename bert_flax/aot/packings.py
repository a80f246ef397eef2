"""The rows a compile is read for: the packing factor of a named length histogram packed by the
config's packer, and the shares of dense attention its rows need and a block-skipping kernel
visits (`--packing_factor` of `python -m bert_flax.aot`; the compile table's rows)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import ml_collections
import numpy as np

import packing
from bert_flax.input_pipeline import synthetic
from bert_flax.kernels import block_ranges

# The named packings `--packing_factor` takes: the length histogram (at the config's length) the
# config's packer packs. corpus_like: `packing.synthetic.corpus_like_histogram`, the figures of a
# real Wikipedia histogram at 128 and 512 (stretched past them); web_like: the bundled long-context
# `lognormal_web` histogram (1,024-8,192; a web-like corpus of log-normal document lengths,
# documents longer than the row split, packing/data/README.md), the long-context rows' packing.
PACKINGS: dict[str, Callable[[int], np.ndarray]] = {
    "corpus_like": lambda length: packing.synthetic.corpus_like_histogram(1_000_000, length),
    "web_like": lambda length: packing.histogram.long_context_histogram("lognormal_web", length),
}


def _named_packing(config: ml_collections.ConfigDict, spec: str) -> packing.StrategySet:
    """The config's packer (`data.algorithm`, `data.max_sequences_per_pack`; padded: one sequence
    a row) on the `PACKINGS[spec]` histogram at the config's length."""
    data = config.data
    if not data.packed:
        return _pack(spec, data.max_seq_length, "none", 1)
    return _pack(spec, data.max_seq_length, data.algorithm, data.max_sequences_per_pack)


@functools.cache  # the packing factor and the attention fractions all read it
def _pack(spec: str, length: int, algorithm: str, depth: int) -> packing.StrategySet:
    return packing.pack_histogram(PACKINGS[spec](length), length, algorithm, depth)


def packing_factor(config: ml_collections.ConfigDict, spec: str) -> float | None:
    """The `--packing_factor` flag's value for `config` (None: the task's own)."""
    if not spec:
        return None
    if not config.data.packed:
        return 1.0
    if spec in PACKINGS:
        return _named_packing(config, spec).metrics().packing_factor
    try:
        return float(spec)
    except ValueError:
        raise ValueError(
            f"--packing_factor={spec!r}: give a number >= 1, one of {sorted(PACKINGS)} or nothing."
        ) from None


# The blocks the expected fraction is counted in: packed_tpu's (128 x 128). packed_gpu's smaller
# ones (128 x 64 forward, 64 x 64 backward) skip a little more: it is charged a little too much.
FRACTION_BLOCK = 128
SKIPPING_ATTENTION = ("packed_tpu", "packed_gpu")  # the attention_impls charged by the fraction


def _rows(config: ml_collections.ConfigDict, spec: str) -> list[tuple[list[int], int]]:
    """(sequence lengths, count) of the rows the `--packing_factor` flag's `spec` stands for: a
    `PACKINGS` name, the config's packing of that histogram (padded: a sequence a row); else the
    task's synthetic packed rows (`synthetic.random_row_lengths`), and for padded rows of unknown
    lengths a row one sequence fills. Sequences lie in a row in the packing's order."""
    length = config.data.max_seq_length
    if spec in PACKINGS:
        return _named_packing(config, spec).strategies
    if config.data.packed:
        depth = config.data.max_sequences_per_pack
        return [(r, 1) for r in synthetic.random_row_lengths(256, length, depth, config.seed)]
    return [([length], 1)]


def attention_needed_fraction(config: ml_collections.ConfigDict, spec: str) -> float:
    """The share of dense attention's scores the sequences of those rows (`_rows`) need: the sum
    of li^2 over L^2, averaged over the rows (every other score is masked)."""
    rows = _rows(config, spec)
    need = sum(count * sum(n * n for n in lengths) for lengths, count in rows)
    return need / (sum(count for _, count in rows) * config.data.max_seq_length**2)


def attention_visited_fraction(
    config: ml_collections.ConfigDict, spec: str, window: int | None = None
) -> float:
    """The share of dense attention's block pairs a block-skipping kernel visits in those rows
    (`_rows`; `block_ranges.expected_visited_fraction`), with a sliding `window` (None: global);
    1 for rows no skipping kernel takes (not a multiple of its block)."""
    length = config.data.max_seq_length
    if length % FRACTION_BLOCK:
        return 1.0
    return block_ranges.expected_visited_fraction(
        _rows(config, spec), length, FRACTION_BLOCK, FRACTION_BLOCK, window
    )
