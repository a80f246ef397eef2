"""Pre-training: masked-LM + NSP on prepared data (`create_pretraining_data`) or random rows,
and its batches for the loop: this process's rows of each global batch, as numpy.

Real data comes from `bert_flax.input_pipeline.datasets.packed_dataset` (or `padded_dataset`, one
sequence a row, with `config.data.packed=False`); `config.data.synthetic` gives random packed
batches instead. Every process reads its own shard (`process_index`/`process_count`) and
yields `global_rows / process_count` rows; `sharding.global_batch` assembles the global array.
Iterators start at a given position (batches already consumed), computed rather than replayed,
which is how a resumed run continues with the data it has not seen yet.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from bert_flax.input_pipeline import synthetic
from bert_flax.input_pipeline.contract import PreparedData, RowShape, check_batch
from bert_flax.model import losses
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig
from bert_flax.tasks.base import Batch, Task, model_config_from

# The masking rate of synthetic batches (prepared data state their own).
SYNTHETIC_MASKED_LM_PROB = 0.15


class PreTrainingTask(Task):
    """Masked-LM + NSP pre-training on prepared data (`create_pretraining_data`) or random rows."""

    name = "pretraining"
    eval_metric = "masked_lm_accuracy"
    eval_metrics_shown = ("mlm_loss", "nsp_accuracy")
    train_metrics_shown = ("mlm_loss", "mlm_accuracy")

    def __init__(self, config: ml_collections.ConfigDict):
        super().__init__(config)
        self.data = None if config.data.synthetic else prepared_data(config)
        self.row_shape = row_shape_of(config, self.data)
        self.eval_row_shape = row_shape_of(config, self.data, packed=eval_packed(config))

    @property
    def objective(self) -> losses.Objective:
        return losses.pretraining_objective(self.config.train.mlm_normalization)

    def model(self, model_config: BertConfig) -> nn.Module:
        return BertForPreTraining(model_config)

    def model_config(self) -> BertConfig:
        vocab_size = None if self.data is None else self.data.vocab_size
        source = None if self.data is None else self.data.data_dir
        return model_config_from(self.config, self.row_shape.max_seq_length, vocab_size, source)

    def pretrained_params(self, pretraining_params: Any, params: Any) -> Any:
        """`BertForPreTraining`'s parameters whole; ValueError for a model without its MLM and
        NSP heads (a converted `BertModel` or task-headed checkpoint)."""
        if "mlm_head" not in pretraining_params:
            raise ValueError(
                f"config.init_from={self.config.init_from!r} holds no pre-training heads (an "
                "encoder-only or task-headed model, e.g. a transformers BertModel or "
                "BertForSequenceClassification): pre-training needs BertForPreTraining's MLM and "
                "NSP heads. Fine-tune from it (a fine-tuning config), or start pre-training from a "
                "BertForPreTraining checkpoint."
            )
        return pretraining_params

    def packing_factor(self) -> float:
        config = self.config
        if not config.data.packed:
            return 1.0
        if self.data is not None:
            depth, algorithm = config.data.max_sequences_per_pack, config.data.algorithm
            return self.data.packing_factor(depth, algorithm)
        rows = synthetic.random_row_lengths(
            256, config.data.max_seq_length, config.data.max_sequences_per_pack, seed=config.seed
        )
        return float(np.mean([len(r) for r in rows]))

    def synthetic_batch(self, rows: int, seed: int) -> Batch:
        vocab_size = self.model_config().vocab_size
        return synthetic.random_batch(rows, self.row_shape, vocab_size=vocab_size, seed=seed)

    def train_batches(self, rows: int, vocab_size: int, *, start: int = 0) -> Iterator[Batch]:
        return train_iterator(self.config, rows, self.row_shape, vocab_size, start=start)

    def eval_batches(self, rows: int, vocab_size: int) -> list[Batch]:
        if self.data is not None:
            check_eval_split(self.data, self.config.eval.split)
        return eval_batches(self.config, rows, self.eval_row_shape, vocab_size)

    def baseline(self, eval_set: list[Batch]) -> tuple[str, float]:
        token, accuracy = most_frequent_token_accuracy(eval_set)
        return f"always predicting token {token}", accuracy

    def identity(self) -> str:
        if self.data is not None:
            return self.data.fingerprint
        return f"synthetic:{self.row_shape.max_seq_length}"

    def check_batch(self, batch: Batch, model_config: BertConfig, *, evaluation: bool) -> None:
        check_batch(batch, model_config, self.eval_row_shape if evaluation else self.row_shape)

    def plot(self, workdir: str) -> list[str]:
        from bert_flax.runs import plots

        return plots.plot_run(workdir, None if self.data is None else self.data.data_dir)

    def describe(self) -> dict[str, Any]:
        return {
            "max_seq_length": self.row_shape.max_seq_length,
            "max_sequences_per_row": self.row_shape.max_sequences_per_pack,
            "max_predictions_per_row": self.row_shape.max_predictions_per_pack,
        }


def prepared_data(config: ml_collections.ConfigDict) -> PreparedData:
    """`config.data.data_dir`, checked against the config."""
    if not config.data.data_dir:
        raise ValueError(
            "config.data.data_dir is empty: prepare data with `python -m "
            "bert_flax.data.create_pretraining_data --output_dir=DIR ...` and pass "
            "--config.data.data_dir=DIR (or --config.data.synthetic=True for random batches)."
        )
    data = PreparedData.load(config.data.data_dir)
    if data.max_seq_length != config.data.max_seq_length:
        raise ValueError(
            f"config.data.max_seq_length={config.data.max_seq_length} but "
            f"{config.data.data_dir} was prepared with max_seq_length={data.max_seq_length}."
        )
    return data


def check_eval_split(data: PreparedData, split: str) -> None:
    """ValueError, before the first step, if prepared split `split` holds no examples."""
    if data.splits.get(split):
        return
    documents = data.summary.get("splits", {}).get(split, {}).get("documents", 0)
    raise ValueError(
        f"The {split!r} split of {data.data_dir} holds no examples ({documents} documents: "
        f"summary.json), so the run has nothing to evaluate on: prepare the data again with "
        "--validation_fraction > 0 (a folder, or a TFDS dataset without a validation split, has "
        "one carved from its documents) and at least 2 documents."
    )


def row_shape_of(
    config: ml_collections.ConfigDict, data: PreparedData | None, *, packed: bool | None = None
) -> RowShape:
    """The batches' row shape (`packed`: default `config.data.packed`): from the prepared data,
    or for synthetic batches from the config (the same bound on masked positions either way)."""
    depth = config.data.max_sequences_per_pack
    packed = config.data.packed if packed is None else packed
    if data is not None:
        return data.row_shape(depth, packed=packed)
    return RowShape.bounded(
        config.data.max_seq_length,
        depth,
        masked_lm_prob=SYNTHETIC_MASKED_LM_PROB,
        max_predictions_per_seq=config.data.max_predictions_per_seq,
        packed=packed,
    )


def local_rows(global_rows: int) -> int:
    return global_rows // jax.process_count()


def synthetic_iterator(
    config: ml_collections.ConfigDict,
    rows: int,
    shape: RowShape,
    vocab_size: int,
    *,
    start: int = 0,
    salt: int = 0,
) -> Iterator[Batch]:
    """Random packed batches; batch i depends only on (seed, salt, i, process)."""
    for index in itertools.count(start):
        key = [config.seed, salt, index, jax.process_index()]
        seed = int(np.random.SeedSequence(key).generate_state(1)[0])
        yield synthetic.random_batch(local_rows(rows), shape, vocab_size=vocab_size, seed=seed)


def eval_packed(config: ml_collections.ConfigDict) -> bool:
    """Whether evaluation rows are packed: as training's, unless `config.eval.padded` (the same
    eval set for a packed and a padded run)."""
    return config.data.packed and not config.eval.padded


def dataset(
    config: ml_collections.ConfigDict, split: str, rows: int, *, train: bool, start: int = 0
):
    """The tf.data pipeline of `split` yielding this process's `rows / process_count` rows."""
    from bert_flax.input_pipeline import datasets

    data = config.data
    options = datasets.InputOptions(
        split=split,
        max_sequences_per_pack=data.max_sequences_per_pack,
        shuffle=train and data.shuffle,
        seed=config.seed,
        repeat=train,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        algorithm=data.algorithm,
        start_batch=start,
    )
    packed = data.packed if train else eval_packed(config)
    entry = datasets.packed_dataset if packed else datasets.padded_dataset
    return entry(data.data_dir, local_rows(rows), options)


def train_iterator(
    config: ml_collections.ConfigDict,
    rows: int,
    shape: RowShape,
    vocab_size: int,
    *,
    start: int = 0,
) -> Iterator[Batch]:
    """Endless training batches from position `start` on."""
    if config.data.synthetic:
        return synthetic_iterator(config, rows, shape, vocab_size, start=start)
    return dataset(
        config, config.data.train_split, rows, train=True, start=start
    ).as_numpy_iterator()


def eval_batches(
    config: ml_collections.ConfigDict, rows: int, shape: RowShape, vocab_size: int
) -> list[Batch]:
    """The fixed evaluation set: `config.eval.num_batches` batches (0 = the whole split)."""
    num = config.eval.num_batches
    if config.data.synthetic:
        it = synthetic_iterator(config, rows, shape, vocab_size, salt=1)
        return list(itertools.islice(it, num or 1))
    ds = dataset(config, config.eval.split, rows, train=False)
    batches = list(itertools.islice(ds.as_numpy_iterator(), num or None))
    if not batches:
        raise ValueError(
            f"The {config.eval.split!r} split of {config.data.data_dir} has fewer than "
            f"{rows} rows for one eval batch; lower config.eval.batch_size."
        )
    return batches


def most_frequent_token_accuracy(batches: list[Batch]) -> tuple[int, float]:
    """The token most often masked in `batches` and the masked-LM accuracy of always
    predicting it (the baseline a useful model must beat)."""
    ids = np.concatenate([b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in batches])
    if ids.size == 0:
        return 0, float("nan")
    values, counts = np.unique(ids, return_counts=True)
    best = int(np.argmax(counts))
    return int(values[best]), float(counts[best] / ids.size)
