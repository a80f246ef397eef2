"""Settings for every test process: one persistent XLA compilation cache.

Many tests (the journeys, fault and benchmark smoke runs, the notebook) start fresh Python
processes that compile the same tiny-model steps; they inherit these variables, so each program
compiles once per machine instead of once per process. Only compilations of at least a second
are cached (the train and eval steps, not the many small helpers). The cache key covers the
program, the XLA flags and the jax version, so a stale entry is never used.
"""

import os
import tempfile

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "bert_flax_tests_xla_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
