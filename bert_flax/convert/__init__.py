"""Checkpoints of other codebases <-> bert_flax parameters: the name tables (`tables.py`),
Hugging Face (`hugging_face.py`), Google BERT (`google_bert.py`), `python -m bert_flax.convert`."""
