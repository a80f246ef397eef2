"""What a run leaves in its workdir, written and read back: metrics (`metrics.py`), plots
(`plots.py`), the checkpoint directory (`checkpoint_files.py`), parameter directories and a run's
best parameters (`parameters.py`), any checkpoint a run can start from (`pretrained.py`), what
made a run (`fingerprint.py`) and its final metrics, by which a finished run is reused
(`finished.py`)."""
