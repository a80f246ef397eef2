"""Training: the loop (`loop.py`, `python -m bert_flax.train`), its setup (`setup.py`), the
jitted steps (`step.py`), the train state saved and resumed (`resume.py`), `--config.*`
overrides (`overrides.py`) and step timing (`timing.py`)."""
