"""Static block structures of block-sparse weights, their generators, validation and JSON I/O.

A `BlockSparseLayout` is a 0/1 mask over [in_blocks, out_blocks] blocks of a weight of shape
[in_features, out_features]. Nonzero block `n` sits at (`rows[n]`, `cols[n]`); the canonical order
is column-major (by output block column, then input block row) and is the order of the stored
`blocks` array [nnz, block_size, block_size] everywhere in this package.

Layouts are immutable and hashable, so they can be static arguments of `jax.jit` and attributes
of Flax modules. The index plans the kernels need are derived from the mask and cached.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

FORMAT = "bert_flax.block_sparse_layout/v1"
LAYOUT_KINDS = ("random", "watts_strogatz", "barabasi_albert", "dense")


class BlockSparseLayout:
    """An immutable 0/1 block mask with the block size it applies to.

    Every input block row and every output block column holds at least one nonzero block unless
    `allow_empty=True` (then unused inputs are ignored and empty output columns are zero before
    the bias).
    """

    __slots__ = ("_cache", "_hash", "block_size", "mask", "meta")

    def __init__(
        self,
        mask: np.ndarray,
        block_size: int,
        *,
        allow_empty: bool = False,
        meta: Mapping[str, Any] | None = None,
    ):
        mask = np.asarray(mask)
        if mask.ndim != 2:
            raise ValueError(
                f"A block mask must be 2-D [in_blocks, out_blocks]; got shape {mask.shape}."
            )
        if mask.dtype != bool:
            if not np.isin(mask, (0, 1)).all():
                raise ValueError("A block mask must hold only 0/1 (or booleans).")
            mask = mask.astype(bool)
        if not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise ValueError(f"block_size must be a positive int; got {block_size!r}.")
        if not mask.any():
            raise ValueError(
                f"The block mask of shape {mask.shape} has no nonzero block; a block-sparse "
                "layer needs at least one (raise the density)."
            )
        if not allow_empty:
            empty_rows = np.flatnonzero(~mask.any(axis=1))
            empty_cols = np.flatnonzero(~mask.any(axis=0))
            if empty_rows.size or empty_cols.size:
                raise ValueError(
                    f"The block mask has {empty_rows.size} input block rows "
                    f"(e.g. {empty_rows[:5].tolist()}) and {empty_cols.size} output block columns "
                    f"(e.g. {empty_cols[:5].tolist()}) with no nonzero block: those inputs would "
                    "be ignored / those outputs constant. Add blocks (the generators do, with "
                    "ensure_coverage=True) or pass allow_empty=True."
                )
        mask = np.ascontiguousarray(mask)
        mask.setflags(write=False)
        self.mask = mask
        self.block_size = int(block_size)
        self.meta = dict(meta or {})
        self._hash = hash((mask.shape, self.block_size, zlib.crc32(np.packbits(mask).tobytes())))
        self._cache: dict[Any, Any] = {}

    # ---- identity -------------------------------------------------------------------------
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockSparseLayout):
            return NotImplemented
        return (
            self._hash == other._hash
            and self.block_size == other.block_size
            and np.array_equal(self.mask, other.mask)
        )

    def __repr__(self) -> str:
        return (
            f"BlockSparseLayout({self.in_features}x{self.out_features}, "
            f"block_size={self.block_size}, nnz={self.nnz}, density={self.density:.3f})"
        )

    # ---- shape ----------------------------------------------------------------------------
    @property
    def in_blocks(self) -> int:
        return self.mask.shape[0]

    @property
    def out_blocks(self) -> int:
        return self.mask.shape[1]

    @property
    def in_features(self) -> int:
        return self.in_blocks * self.block_size

    @property
    def out_features(self) -> int:
        return self.out_blocks * self.block_size

    @property
    def nnz(self) -> int:
        """Number of nonzero (stored) blocks."""
        return int(self._coords()[0].size)

    @property
    def density(self) -> float:
        """Fraction of nonzero blocks."""
        return self.nnz / self.mask.size

    @property
    def blocks_shape(self) -> tuple[int, int, int]:
        return (self.nnz, self.block_size, self.block_size)

    def _coords(self) -> tuple[np.ndarray, np.ndarray]:
        if "coords" not in self._cache:
            cols, rows = np.nonzero(self.mask.T)  # column-major: by column, then row
            self._cache["coords"] = (rows.astype(np.int32), cols.astype(np.int32))
        return self._cache["coords"]

    @property
    def rows(self) -> np.ndarray:
        """Input block row of each nonzero block (canonical order)."""
        return self._coords()[0]

    @property
    def cols(self) -> np.ndarray:
        """Output block column of each nonzero block (canonical order)."""
        return self._coords()[1]

    def fan_in(self) -> np.ndarray:
        """Real fan-in (in features) of each output block column: [out_blocks]."""
        return self.mask.sum(axis=0) * self.block_size

    def cached(self, key: Any, build):
        """Memoises `build()` under `key` on this layout (used for the kernels' index plans)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    # ---- dense conversion (references, debugging, initialising from a dense weight) -------
    def to_dense(self, blocks: Any) -> np.ndarray:
        """Scatters `blocks` [nnz, bs, bs] into a dense [in_features, out_features] numpy array."""
        blocks = np.asarray(blocks)
        self.check_blocks_shape(blocks.shape)
        bs = self.block_size
        dense = np.zeros((self.in_blocks, bs, self.out_blocks, bs), blocks.dtype)
        dense[self.rows, :, self.cols, :] = blocks
        return dense.reshape(self.in_features, self.out_features)

    def from_dense(self, weight: Any) -> np.ndarray:
        """Gathers the nonzero blocks [nnz, bs, bs] of a dense [in, out] weight."""
        weight = np.asarray(weight)
        if weight.shape != (self.in_features, self.out_features):
            raise ValueError(
                f"Dense weight has shape {weight.shape}; this layout is "
                f"{(self.in_features, self.out_features)}."
            )
        bs = self.block_size
        w4 = weight.reshape(self.in_blocks, bs, self.out_blocks, bs)
        return w4[self.rows, :, self.cols, :]

    def check_blocks_shape(self, shape: tuple[int, ...]) -> None:
        if tuple(shape) != self.blocks_shape:
            raise ValueError(
                f"blocks have shape {tuple(shape)}, but the layout {self!r} stores "
                f"{self.blocks_shape} (nnz, block_size, block_size)."
            )

    # ---- JSON ------------------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "block_size": self.block_size,
            "shape": list(self.mask.shape),
            "rows": self.rows.tolist(),
            "cols": self.cols.tolist(),
            "meta": self.meta,
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> BlockSparseLayout:
        if data.get("format") != FORMAT:
            raise ValueError(f"Not a block-sparse layout (format={data.get('format')!r}).")
        mask = np.zeros(tuple(data["shape"]), bool)
        mask[np.asarray(data["rows"], int), np.asarray(data["cols"], int)] = True
        return cls(mask, int(data["block_size"]), allow_empty=True, meta=data.get("meta"))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json_dict(), f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> BlockSparseLayout:
        with open(path, encoding="utf-8") as f:
            return cls.from_json_dict(json.load(f))

    # ---- constructors ----------------------------------------------------------------------
    @classmethod
    def from_mask(cls, mask: Any, block_size: int, *, allow_empty: bool = False):
        """A layout from a numpy 0/1 mask [in_blocks, out_blocks] (validated)."""
        return cls(mask, block_size, allow_empty=allow_empty, meta={"kind": "mask"})


def _blocks(features: int, block_size: int, what: str) -> int:
    if features % block_size:
        raise ValueError(
            f"{what}={features} is not a multiple of block_size={block_size}; choose a block "
            "size that divides both feature sizes."
        )
    return features // block_size


def _cover(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Adds one random block to every empty row and column (so no input/output is orphaned)."""
    mask = mask.copy()
    for i in np.flatnonzero(~mask.any(axis=1)):
        mask[i, rng.integers(mask.shape[1])] = True
    for j in np.flatnonzero(~mask.any(axis=0)):
        mask[rng.integers(mask.shape[0]), j] = True
    return mask


def _check_density(density: float) -> None:
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1]; got {density}.")


def random_layout(
    in_features: int,
    out_features: int,
    block_size: int,
    density: float,
    *,
    seed: int = 0,
    ensure_coverage: bool = True,
) -> BlockSparseLayout:
    """Random blocks, exactly round(density * blocks) of them (at least one), seeded.

    With `ensure_coverage` (default) the first max(in_blocks, out_blocks) blocks pair a random
    permutation of the rows with one of the columns, so that every row and column holds a block,
    and the rest are drawn uniformly from the remaining positions; the count is then at least
    max(in_blocks, out_blocks) (the realised density is in `layout.density`). Without it, blocks
    are uniform and rows/columns may be empty.
    """
    _check_density(density)
    shape = (
        _blocks(in_features, block_size, "in_features"),
        _blocks(out_features, block_size, "out_features"),
    )
    total = shape[0] * shape[1]
    rng = np.random.default_rng(seed)
    nnz = max(1, round(density * total))
    mask = np.zeros(shape, bool)
    if ensure_coverage:
        cover = max(shape)
        rows, cols = rng.permutation(shape[0]), rng.permutation(shape[1])
        t = np.arange(cover)
        mask[rows[t % shape[0]], cols[t % shape[1]]] = True
        nnz = max(nnz, cover)
    free = np.flatnonzero(~mask.reshape(-1))
    mask.reshape(-1)[rng.permutation(free)[: nnz - int(mask.sum())]] = True
    meta = {"kind": "random", "density": density, "seed": seed}
    return BlockSparseLayout(mask, block_size, allow_empty=not ensure_coverage, meta=meta)


def dense_layout(in_features: int, out_features: int, block_size: int) -> BlockSparseLayout:
    """All blocks present (density 1); useful as a baseline."""
    shape = (
        _blocks(in_features, block_size, "in_features"),
        _blocks(out_features, block_size, "out_features"),
    )
    return BlockSparseLayout(np.ones(shape, bool), block_size, meta={"kind": "dense"})


def watts_strogatz_graph(n: int, k: int, p: float, rng: np.random.Generator) -> np.ndarray:
    """Adjacency [n, n] (bool, symmetric, no self loops) of a Watts-Strogatz small world.

    A ring where each node links to its k nearest neighbours (k // 2 per side); each edge
    (u, u + s) is then rewired with probability p to (u, w) for a uniformly chosen w that is
    neither u nor already a neighbour.
    """
    if not 0 <= k < n:
        raise ValueError(f"Watts-Strogatz needs 0 <= k < n; got k={k}, n={n}.")
    adj = np.zeros((n, n), bool)
    nodes = np.arange(n)
    for s in range(1, k // 2 + 1):
        adj[nodes, (nodes + s) % n] = adj[(nodes + s) % n, nodes] = True
    for s in range(1, k // 2 + 1):
        for u in range(n):
            v = (u + s) % n
            if rng.random() >= p or not adj[u, v]:
                continue
            free = np.flatnonzero(~adj[u])
            free = free[free != u]
            if free.size == 0:
                continue
            w = rng.choice(free)
            adj[u, v] = adj[v, u] = False
            adj[u, w] = adj[w, u] = True
    return adj


def barabasi_albert_graph(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Adjacency [n, n] (bool, symmetric, no self loops) of a Barabasi-Albert graph.

    Starts from a star on m + 1 nodes; every later node links to m distinct earlier nodes chosen
    with probability proportional to their degree (preferential attachment).
    """
    if not 1 <= m < n:
        raise ValueError(f"Barabasi-Albert needs 1 <= m < n; got m={m}, n={n}.")
    adj = np.zeros((n, n), bool)
    adj[0, 1 : m + 1] = adj[1 : m + 1, 0] = True
    degree = adj.sum(axis=1).astype(np.float64)
    for u in range(m + 1, n):
        targets = rng.choice(u, size=m, replace=False, p=degree[:u] / degree[:u].sum())
        adj[u, targets] = adj[targets, u] = True
        degree[targets] += 1
        degree[u] = m
    return adj


def small_world_layout(
    kind: str,
    in_features: int,
    out_features: int,
    block_size: int,
    density: float,
    *,
    seed: int = 0,
    rewire_prob: float = 0.1,
) -> BlockSparseLayout:
    """A block mask from a small-world graph over the blocks ("watts_strogatz"/"barabasi_albert").

    The graph has n = max(in_blocks, out_blocks) nodes, and its adjacency plus the diagonal
    (every block row feeds its own column, as in the blocksparse LSTM work) is the mask; for a
    rectangular weight the smaller side takes n-evenly-spaced nodes. The mean degree is chosen
    from `density` (k ~ density * n for Watts-Strogatz, m ~ density * n / 2 for Barabasi-Albert).
    Rows/columns left empty by the subsampling get one random block.
    """
    _check_density(density)
    in_b = _blocks(in_features, block_size, "in_features")
    out_b = _blocks(out_features, block_size, "out_features")
    n = max(in_b, out_b)
    rng = np.random.default_rng(seed)
    if kind == "watts_strogatz":
        k = min(n - 1, 2 * max(1, round((density * n - 1) / 2)))
        adj = watts_strogatz_graph(n, k, rewire_prob, rng)
    elif kind == "barabasi_albert":
        adj = barabasi_albert_graph(n, min(n - 1, max(1, round((density * n - 1) / 2))), rng)
    else:
        raise ValueError(
            f"Unknown small-world kind {kind!r}; use 'watts_strogatz' or 'barabasi_albert'."
        )
    adj = adj | np.eye(n, dtype=bool)
    mask = adj[np.ix_(np.arange(in_b) * n // in_b, np.arange(out_b) * n // out_b)]
    mask = _cover(mask, rng)
    meta = {"kind": kind, "density": density, "seed": seed, "rewire_prob": rewire_prob}
    return BlockSparseLayout(mask, block_size, meta=meta)


def make_layout(
    kind: str,
    in_features: int,
    out_features: int,
    block_size: int,
    density: float,
    *,
    seed: int = 0,
    **kwargs: Any,
) -> BlockSparseLayout:
    """Dispatches on `kind` (one of LAYOUT_KINDS)."""
    if kind == "random":
        return random_layout(in_features, out_features, block_size, density, seed=seed, **kwargs)
    if kind == "dense":
        return dense_layout(in_features, out_features, block_size)
    if kind in ("watts_strogatz", "barabasi_albert"):
        return small_world_layout(
            kind, in_features, out_features, block_size, density, seed=seed, **kwargs
        )
    raise ValueError(f"Unknown layout kind {kind!r}; choose one of {LAYOUT_KINDS}.")
