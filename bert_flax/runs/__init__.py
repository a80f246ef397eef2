"""What a run leaves in its workdir, written and read back: metrics (`metrics.py`), plots
(`plots.py`), the checkpoint directory (`checkpoints.py`), parameter directories and a run's
best parameters (`parameters.py`), and any checkpoint a run can start from (`pretrained.py`)."""
