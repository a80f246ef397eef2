"""Packed BERT in JAX/Flax: model, packed data pipeline, trainer, block-sparse layers, profiler."""

__version__ = "0.1.0"  # the project's one version (setup.py reads it from here)
