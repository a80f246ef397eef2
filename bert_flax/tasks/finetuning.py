"""`FineTuningTask`: what every fine-tuning task shares. Each split is a table of examples
(`rows.Examples`: a classification split, a QA set's windows); an epoch packs the training
table's lengths into rows (the project's packers, or one example a row when padded), so the
packing factor and the steps per epoch are known before training; evaluation is one pass over
the evaluation split, its last batch padded with empty rows."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
from absl import logging

from bert_flax.data import tokenization
from bert_flax.input_pipeline import rows as data_rows
from bert_flax.runs import pretrained
from bert_flax.tasks.base import Batch, Task


def task_vocab(config: ml_collections.ConfigDict) -> tokenization.Vocab:
    """`config.data.vocab_file`, else `config.init_from`'s vocabulary where it says, else
    bert-base-uncased's; lower-casing as `config.data.lowercase` says (None: as `init_from` was
    trained, where it says, else uncased unless the vocabulary is cased)."""
    vocab_file, lowercase, init_from = (
        config.data.vocab_file,
        config.data.lowercase,
        config.init_from,
    )
    if not vocab_file and init_from:
        vocab_file = pretrained.pretrained_vocab_file(init_from)
        if vocab_file:
            logging.info("Tokenizing with %s, the vocabulary of %s", vocab_file, init_from)
    if lowercase in (None, ""):
        lowercase = pretrained.pretrained_lowercase(init_from) if init_from else None
    vocab = tokenization.load_vocab(vocab_file or None, lowercase=lowercase is not False)
    if lowercase is None and vocab.lowercase and tokenization.is_cased(vocab):
        logging.info("%s is a cased vocabulary: the text keeps its case.", vocab.path)
        vocab = tokenization.load_vocab(vocab_file or None, lowercase=False)
    return vocab


class FineTuningTask(Task):
    """A task trained in epochs over `self.encoded[split]` (set by the subclass's constructor)."""

    encoded: dict[str, data_rows.Examples]

    @property
    def depth(self) -> int:
        """Sequence slots per row (1 when padded)."""
        return self.config.data.max_sequences_per_pack if self.config.data.packed else 1

    @functools.cached_property
    def epoch_rows(self) -> list[list[int]]:
        """The train split's rows of epoch 0 (every epoch packs the same lengths into as many
        rows); computed once for the packing factor and the steps per epoch."""
        data = self.config.data
        return data_rows.pack_examples(
            self.encoded["train"].lengths,
            data.max_seq_length,
            self.depth,
            algorithm=data.algorithm,
            seed=data_rows.epoch_seed(self.config.seed, 0),
            packed=data.packed,
        )

    def packing_factor(self) -> float:
        if not self.config.data.packed:
            return 1.0
        return data_rows.packing_factor(self.epoch_rows)

    def batches(self, split: str, rows: int, **kwargs: Any) -> Iterator[Batch]:
        """This process's share of batches of `rows` global rows over `split`."""
        data = self.config.data
        return data_rows.batches(
            self.encoded[split],
            batch_size=rows // jax.process_count(),
            max_seq_length=data.max_seq_length,
            max_sequences_per_pack=self.depth,
            packed=data.packed,
            algorithm=data.algorithm,
            seed=self.config.seed,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            **kwargs,
        )

    @property
    def eval_splits(self) -> list[str]:
        """The splits each evaluation runs over, in order (`config.eval.split`: one, or several
        separated by commas, e.g. MNLI's matched and mismatched; the first judges the run)."""
        return self.config.eval.split.split(",")

    def synthetic_batch(self, rows: int, seed: int) -> Batch:
        """The first `rows` rows of the evaluation split (real rows of the right shape)."""
        batches = self.batches(
            self.eval_splits[0], rows * jax.process_count(), shuffle=False, pad_final=True
        )
        return {name: value[:rows] for name, value in next(batches).items()}

    def steps_per_epoch(self, global_rows: int) -> int:
        return len(self.epoch_rows) // global_rows

    def train_batches(self, rows: int, vocab_size: int, *, start: int = 0) -> Iterator[Batch]:
        per_epoch = self.steps_per_epoch(rows)
        if per_epoch == 0:
            raise ValueError(
                f"The train split makes {len(self.epoch_rows)} rows, fewer than one batch of "
                f"{rows}; lower config.train.batch_size."
            )
        first_epoch, skip = divmod(start, per_epoch)
        for epoch in itertools.count(first_epoch):
            batches = self.batches("train", rows, epoch=epoch, shuffle=self.config.data.shuffle)
            yield from itertools.islice(batches, skip if epoch == first_epoch else 0, None)

    def predict_test(self, workdir: str) -> dict[str, Any]:
        """`predict_split` of the "test" split, if the task has one."""
        if "test" not in self.encoded:
            return {}
        return {"test": self.predict_split(workdir, "test")}

    def predict_split(self, workdir: str, split: str) -> dict[str, Any]:
        """The best parameters' predictions on `split`, written to the workdir, and (where it is
        labelled) their metrics."""
        raise NotImplementedError(f"The {self.name} task does not predict a {split} split.")

    def split_batches(self, split: str, rows: int) -> list[Batch]:
        """One pass over `split`, its last batch padded with empty rows."""
        return list(self.batches(split, rows, shuffle=False, pad_final=True))

    def eval_batches(self, rows: int, vocab_size: int) -> list[Batch]:
        """The evaluation splits' batches, one split after the other."""
        return [batch for split in self.eval_splits for batch in self.split_batches(split, rows)]
