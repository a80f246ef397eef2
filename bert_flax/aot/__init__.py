"""Ahead-of-time compilation for chips this host does not have: a run's steps compiled for a TPU
slice or GPU (`program.py`), read against the chip as a roofline (`roofline.py`), for the rows of
a named packing (`packings.py`), the largest batch that fits (`largest_batch.py`), the targets
(`targets.py`); `python -m bert_flax.aot`."""
