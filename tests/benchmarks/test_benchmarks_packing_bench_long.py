"""packing_bench's long-context mode: a run past its time limit is stopped and recorded, a
refusal is recorded with its reason, and the docs' table renders every case at every length."""

from __future__ import annotations

import time

from benchmarks import packing_bench
from benchmarks.lib.blocks import published
from packing import histogram


def test_runs_are_measured_refused_or_stopped_at_the_limit():
    hist = histogram.long_context_histogram("lognormal_web", 2048)
    start = time.perf_counter()
    stopped = packing_bench.pack_within(hist, 2048, "nnlshp", 3, limit=1.0)
    assert stopped == {"timed_out": 1.0} and time.perf_counter() - start < 10
    refused = packing_bench.pack_within(hist, 2048, "nnlshp", 0, limit=1.0)
    assert "finite max_depth" in refused["refused"]
    run = packing_bench.pack_within(hist, 2048, "lpfhp", 0, limit=30.0)
    assert run["efficiency"] > 99.9 and run["max_depth_used"] > 3


def test_the_table_has_a_row_per_case_and_a_column_per_length():
    block = packing_bench.packing_long_block(published)
    for corpus in histogram.LONG_CONTEXT_CORPORA:
        assert f"{corpus} (efficiency" in block
    header = "| algorithm | depth | " + " | ".join(map(str, histogram.LONG_CONTEXT_LENGTHS)) + " |"
    assert block.count(header) == len(histogram.LONG_CONTEXT_CORPORA)
    assert "| nnlshp | 3 | " in block and "refused |" in block and "stopped at 20 s" in block
