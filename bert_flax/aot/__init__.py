"""Ahead-of-time compilation for chips this host does not have: a run's steps compiled for a
TPU slice or GPU (`program.py`), the targets (`targets.py`), `python -m bert_flax.aot.program`."""
