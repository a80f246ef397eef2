"""The BERT model: its config (`config.py`), the attention backends (`attention.py`), the
layers (`layers.py`), the pre-training model (`bert.py`) and its losses (`losses.py`)."""
