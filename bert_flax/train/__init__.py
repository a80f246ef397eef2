"""Training: the loop (`loop.py`, `python -m bert_flax.train`), its setup (`setup.py`), the
jitted steps (`step.py`), checkpointing of the train state (`checkpointing.py`), what made a
run (`fingerprint.py`), `--config.*` overrides (`overrides.py`) and step timing (`timing.py`)."""
