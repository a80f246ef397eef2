"""Sequence packing for transformer training: histograms, SPFHP, LPFHP, NNLSHP, LP, assignment.

Pure numpy/scipy. Typical use::

  import packing
  hist = packing.histogram.from_lengths(lengths, max_len=512)
  strategies = packing.pack_histogram(hist, max_len=512, algorithm="nnlshp", max_depth=3)
  print(strategies.metrics())
  assignment = packing.assign_sequences(lengths, strategies)  # lists of indices, one per row
"""

from packing import histogram, synthetic
from packing.api import ALGORITHMS, default_packing, pack_histogram
from packing.assign import Assignment, assign_sequences, count_packs, plan_packs
from packing.histogram import from_lengths, load_histogram, save_histogram, validate_histogram
from packing.lp import lower_bound
from packing.online import OnlinePacker
from packing.strategy_set import PackingMetrics, StrategySet

__all__ = [
    "ALGORITHMS",
    "Assignment",
    "OnlinePacker",
    "PackingMetrics",
    "StrategySet",
    "assign_sequences",
    "count_packs",
    "default_packing",
    "from_lengths",
    "histogram",
    "load_histogram",
    "lower_bound",
    "pack_histogram",
    "plan_packs",
    "save_histogram",
    "synthetic",
    "validate_histogram",
]
