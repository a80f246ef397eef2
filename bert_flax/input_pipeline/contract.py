"""The packed-batch contract between the data pipelines and the model, in code (no TensorFlow).

A batch is a dict of fixed-shape arrays, batch dimension first: per row, core fields every task
has (`CORE_FEATURES`: tokens [L], and per sequence slot [D] its [CLS] index and whether it is
real) plus the task's feature set (`PRETRAINING_FEATURES`: masked positions [P] and NSP labels;
`CLASSIFICATION_FEATURES`: labels and example ids). The table of every feature is in
docs/design.md ("The packed batch"). `bert_flax.input_pipeline.rows.build_rows` makes rows of
any task; a padded (unpacked) batch is the same with D = 1.

    data = PreparedData.load("workdir/sotu_128")   # what create_pretraining_data wrote
    shape = data.row_shape(max_sequences_per_pack=3)
    check_batch(next(batches), model_config, shape)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

import packing
from packing import histogram as packing_histogram

if TYPE_CHECKING:
    from bert_flax.model.config import BertConfig

ROW_FEATURES = ("input_ids", "token_type_ids", "segment_ids", "positions")  # [L]
SLOT_FEATURES = ("cls_positions", "sequence_mask")  # [D]
CORE_FEATURES = ROW_FEATURES + SLOT_FEATURES
# The task feature sets, added to the core fields.
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")  # [P]
PRETRAINING_FEATURES = CORE_FEATURES + PREDICTION_FEATURES + ("next_sentence_labels",)
CLASSIFICATION_FEATURES = (*CORE_FEATURES, "labels", "example_ids")
# Multi-label classification: `multi_labels` [D, K], a 0/1 target per slot and label.
MULTI_LABEL_FEATURES = (*CORE_FEATURES, "multi_labels", "example_ids")
TASK_SLOT_FEATURES = ("next_sentence_labels", "labels", "example_ids")  # [D]
# float32; `labels` too for a regression task (int32 class ids otherwise).
FLOAT_FEATURES = ("masked_lm_weights", "sequence_mask", "multi_labels")
# What each model reads; the other features are targets, weights and bookkeeping.
PRETRAINING_INPUTS = (*ROW_FEATURES, "masked_lm_positions", "cls_positions")
CLASSIFICATION_INPUTS = (*ROW_FEATURES, "cls_positions")

SUMMARY_FILE = "summary.json"
STRATEGIES_FILE = "strategies.json"
HISTOGRAM_FILE = "histogram.txt"


def feature_dtype(name: str) -> np.dtype:
    return np.dtype(np.float32 if name in FLOAT_FEATURES else np.int32)


def max_predictions_per_pack(
    max_seq_length: int, max_sequences: int, masked_lm_prob: float, max_predictions_per_seq: int
) -> int:
    """The most masked positions a row can hold: sequence i predicts at most
    `min(M, max(1, round(l_i * p)))` <= l_i * p + 1 tokens, and sum(l_i) <= L."""
    bound = math.floor(masked_lm_prob * max_seq_length + 1e-9) + max_sequences
    return int(min(max_sequences * max_predictions_per_seq, bound))


@dataclasses.dataclass
class Example:
    """One pre-training example, unpadded (length = len(input_ids) <= max_seq_length): what a
    record holds (`records.serialize`), made by `bert_flax.data.examples`."""

    input_ids: np.ndarray  # int32 [n], masks applied
    token_type_ids: np.ndarray  # int32 [n]
    masked_lm_positions: np.ndarray  # int32 [m], increasing
    masked_lm_ids: np.ndarray  # int32 [m], original ids
    next_sentence_label: int  # 0 = IsNext, 1 = random next


@dataclasses.dataclass(frozen=True)
class RowShape:
    """L (tokens per row), D (sequences per row), P (masked positions per row; 0 for a task
    without masked-LM predictions)."""

    max_seq_length: int
    max_sequences_per_pack: int
    max_predictions_per_pack: int = 0

    @classmethod
    def bounded(
        cls,
        max_seq_length: int,
        max_sequences_per_pack: int,
        *,
        masked_lm_prob: float,
        max_predictions_per_seq: int,
        packed: bool = True,
    ) -> RowShape:
        """Rows holding up to D sequences and the most predictions they can (padded: D = 1 and
        the per-sequence maximum M)."""
        if not packed:
            return cls(max_seq_length, 1, max_predictions_per_seq)
        bound = max_predictions_per_pack(
            max_seq_length, max_sequences_per_pack, masked_lm_prob, max_predictions_per_seq
        )
        return cls(max_seq_length, max_sequences_per_pack, bound)

    def feature_shape(self, name: str) -> tuple[int]:
        if name in ROW_FEATURES:
            return (self.max_seq_length,)
        if name in PREDICTION_FEATURES:
            return (self.max_predictions_per_pack,)
        if name in SLOT_FEATURES + TASK_SLOT_FEATURES:
            return (self.max_sequences_per_pack,)
        raise KeyError(
            f"{name!r} is not a feature of the packed-batch contract: {PRETRAINING_FEATURES} "
            f"(pre-training), {CLASSIFICATION_FEATURES} (classification)."
        )


@dataclasses.dataclass(frozen=True)
class PreparedData:
    """A directory written by `bert_flax.data.create_pretraining_data`, read from its summary."""

    data_dir: str
    summary: dict[str, Any]

    @classmethod
    def load(cls, data_dir: str) -> PreparedData:
        path = os.path.join(data_dir, SUMMARY_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path} not found: {data_dir!r} is not a directory prepared by "
                "`python -m bert_flax.data.create_pretraining_data --output_dir=DIR`."
            )
        with open(path) as f:
            return cls(data_dir, json.load(f))

    @property
    def vocab_file(self) -> str | None:
        """The vocab.txt the data was tokenized with (None for synthetic data, which has none)."""
        return self.summary["vocab"].get("path")

    @property
    def max_seq_length(self) -> int:
        return int(self.summary["options"]["max_seq_length"])

    @property
    def max_predictions_per_seq(self) -> int:
        return int(self.summary["options"]["max_predictions_per_seq"])

    @property
    def masked_lm_prob(self) -> float:
        return float(self.summary["options"]["masked_lm_prob"])

    @property
    def vocab_size(self) -> int:
        return int(self.summary["vocab"]["size"])

    @property
    def cls_id(self) -> int:
        return int(self.summary["vocab"]["special_ids"]["cls"])

    @property
    def fingerprint(self) -> str:
        """A digest of the summary: the same data wherever the directory lives."""
        text = json.dumps(self.summary, sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:16]

    @property
    def splits(self) -> dict[str, int]:
        """Examples per split, e.g. {"train": 9000, "validation": 1000}."""
        return {
            name: int(sum(split.get("examples_per_shard", ())))
            for name, split in self.summary.get("splits", {}).items()
        }

    def row_shape(self, max_sequences_per_pack: int, *, packed: bool = True) -> RowShape:
        return RowShape.bounded(
            self.max_seq_length,
            max_sequences_per_pack,
            masked_lm_prob=self.masked_lm_prob,
            max_predictions_per_seq=self.max_predictions_per_seq,
            packed=packed,
        )

    def strategies(self, max_sequences_per_pack: int, algorithm: str) -> packing.StrategySet:
        """strategies.json, or (if missing) the strategies `algorithm` solves on histogram.txt."""
        return load_strategies(
            self.data_dir, None, self.max_seq_length, max_sequences_per_pack, algorithm
        )

    def packing_factor(self, max_sequences_per_pack: int, algorithm: str) -> float:
        """Mean sequences per row of the packing strategies."""
        metrics = self.strategies(max_sequences_per_pack, algorithm).metrics()
        return float(metrics.packing_factor)


def check_batch(
    batch: Mapping[str, np.ndarray],
    config: BertConfig,
    shape: RowShape | None = None,
    features: tuple[str, ...] = PRETRAINING_FEATURES,
) -> None:
    """Host-side check of a (numpy) batch of `features` against the contract, the model config
    and `shape`.

    Inside jit, out-of-range ids give NaN embeddings and predictions outside every sequence are
    silently left out of the per-sequence losses; the training loop calls this on its first
    batch to fail early with a message naming the feature. Raises ValueError.
    """
    missing = [name for name in features if name not in batch]
    if missing:
        raise ValueError(f"Batch lacks features {missing} (docs/design.md: the packed batch).")
    b = {name: np.asarray(batch[name]) for name in features}
    slot_features = [n for n in features if n in SLOT_FEATURES + TASK_SLOT_FEATURES]
    for group in (ROW_FEATURES, PREDICTION_FEATURES, slot_features):
        shapes = {name: b[name].shape for name in group if name in b}
        if shapes and (len(set(shapes.values())) != 1 or b[group[0]].ndim != 2):
            raise ValueError(f"Features {list(shapes)} need one shared [batch, n] shape: {shapes}.")
    for name in features:
        if shape is not None and b[name].shape[1:] != shape.feature_shape(name):
            raise ValueError(
                f"{name} has rows of shape {b[name].shape[1:]}, not "
                f"{shape.feature_shape(name)} of {shape}."
            )
        if name != "labels" and b[name].dtype != feature_dtype(name):
            raise ValueError(f"{name} is {b[name].dtype}, not {feature_dtype(name)}.")
    length, slots = b["input_ids"].shape[1], b["cls_positions"].shape[1]
    limits = {
        "input_ids": (config.vocab_size, "vocab_size"),
        "token_type_ids": (config.type_vocab_size, "type_vocab_size"),
        "positions": (config.max_position_embeddings, "max_position_embeddings"),
        "segment_ids": (slots + 1, "the number of sequence slots + 1"),
        "masked_lm_positions": (length, "the row length"),
        "cls_positions": (length, "the row length"),
    }
    for name, (limit, what) in limits.items():
        if name not in b:
            continue
        low, high = int(b[name].min()), int(b[name].max())
        if low < 0 or high >= limit:
            raise ValueError(f"{name} spans [{low}, {high}], outside [0, {limit}) ({what}).")
    if "masked_lm_positions" in b:
        owner = np.take_along_axis(b["segment_ids"], b["masked_lm_positions"], axis=1)
        if np.any((b["masked_lm_weights"] > 0) & (owner == 0)):
            raise ValueError("Some real masked_lm_positions point at padding (segment_ids == 0).")


def load_strategies(
    data_dir: str,
    strategies: str | packing.StrategySet | None,
    max_seq_length: int,
    max_sequences_per_pack: int,
    algorithm: str,
) -> packing.StrategySet:
    """A StrategySet from an object, a path, DIR/strategies.json, or (when that file is missing)
    solved with `algorithm` from DIR/histogram.txt and cached there; its `max_depth` (what the
    fallback packer may use for uncovered sequences) at most `max_sequences_per_pack`."""
    if isinstance(strategies, packing.StrategySet):
        strategy_set = strategies
    else:
        path = strategies or os.path.join(data_dir, STRATEGIES_FILE)
        if os.path.isfile(path):
            strategy_set = packing.StrategySet.load(path)
        elif strategies:
            raise FileNotFoundError(f"Strategies file {strategies!r} does not exist.")
        else:
            histogram_path = os.path.join(data_dir, HISTOGRAM_FILE)
            if not os.path.isfile(histogram_path):
                raise FileNotFoundError(
                    f"{data_dir} has neither {STRATEGIES_FILE} nor {HISTOGRAM_FILE} to solve it "
                    "from; rerun bert_flax.data.create_pretraining_data (it writes both)."
                )
            hist = packing_histogram.load_histogram(histogram_path)
            strategy_set = packing.pack_histogram(
                hist, max_seq_length, algorithm=algorithm, max_depth=max_sequences_per_pack
            )
            try:
                strategy_set.save(path)
            except OSError:
                pass  # a read-only data dir: use the strategies without caching them
    if strategy_set.max_len != max_seq_length:
        raise ValueError(
            f"Strategies are for rows of {strategy_set.max_len} tokens but the data has "
            f"max_seq_length={max_seq_length}; recompute them for this data."
        )
    depth = max(len(s) for s, _ in strategy_set.strategies) if strategy_set.strategies else 0
    if depth > max_sequences_per_pack:
        raise ValueError(
            f"Strategies put up to {depth} sequences in a pack but max_sequences_per_pack="
            f"{max_sequences_per_pack}; raise it or recompute strategies with max_depth="
            f"{max_sequences_per_pack}."
        )
    if not strategy_set.max_depth or strategy_set.max_depth > max_sequences_per_pack:
        # Sequences the strategies do not cover go to the fallback packer at the strategies'
        # max_depth: bound it by the rows' D (a depth-0 file means unlimited).
        strategy_set = dataclasses.replace(strategy_set, max_depth=max_sequences_per_pack)
    return strategy_set
