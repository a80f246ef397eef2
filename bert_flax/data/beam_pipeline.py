"""``create_pretraining_data`` on Apache Beam: the stages of ``stages.py`` as a pipeline, for
the DirectRunner on one machine or Dataflow, Flink and Spark clusters (``pip install .[beam]``).

Per split:

    read units (TFDS slices) --ParDo: read, tokenize--> (bucket, document)
      --GroupByKey--> buckets --ParDo: examples--> (shard, keyed record)
      --GroupByKey--> shards --Map: sort by key, write--> shard files + their metadata
    counts of both ParDos --CombineGlobally--> counts file

Every stage is deterministic (buckets are sorted by ordinal, shards by key), so the output is
byte for byte the local runner's, whatever the runner and its parallelism. Workers write the
shards and their metadata to the output directory, which the workers and the launching process
must share (local disk for the DirectRunner; a shared mount on a cluster).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from bert_flax.data import stages, tokenization
from bert_flax.data.examples import Recipe

COUNTS = "counts"


class ReadAndTokenize(beam.DoFn):
    """A read unit's documents, tokenized and keyed by bucket; counts as a tagged output."""

    def __init__(self, source: stages.Source, vocab: str, lowercase: bool, per_bucket: int):
        self.source, self.vocab_path, self.lowercase = source, vocab, lowercase
        self.per_bucket = per_bucket

    def setup(self) -> None:
        self.vocab = tokenization.load_vocab(self.vocab_path, lowercase=self.lowercase)

    def process(self, unit: tuple[int, int]) -> Iterator:
        documents, counts = stages.tokenize_unit(self.vocab, list(self.source.read(*unit)))
        yield beam.pvalue.TaggedOutput(COUNTS, counts)
        for ordinal, sentences in documents:
            bucket = stages.bucket_of(ordinal, self.source.num_documents, self.per_bucket)
            yield bucket, (ordinal, sentences)


class BucketExamples(beam.DoFn):
    """A bucket's keyed examples, keyed by shard; the recipe's counts as a tagged output."""

    def __init__(self, recipe: Recipe, seed: int, split: str, num_shards: int):
        self.recipe, self.seed, self.split, self.num_shards = recipe, seed, split, num_shards

    def process(self, bucket: tuple[int, Iterable[stages.TokenizedDocument]]) -> Iterator:
        keyed, stats = stages.bucket_examples(
            bucket[1], self.recipe, seed=self.seed, split=self.split
        )
        yield beam.pvalue.TaggedOutput(COUNTS, stats.as_dict())
        for record in keyed:
            yield record.key % self.num_shards, record


def write_shard(
    shard: tuple[int, Iterable[stages.KeyedRecord]], paths: Sequence[str], work_dir: str, split: str
) -> None:
    index, keyed = shard
    meta = stages.write_shard(paths[index], keyed)
    meta.save(stages.meta_path(work_dir, split, index))


def add_split(
    pipeline: beam.Pipeline,
    source: stages.Source,
    paths: Sequence[str],
    recipe: Recipe,
    *,
    vocab: str,
    lowercase: bool,
    seed: int,
    documents_per_bucket: int,
    work_dir: str,
) -> None:
    """The stages of one split, added to ``pipeline``."""
    split = source.split
    read = ReadAndTokenize(source, vocab, lowercase, documents_per_bucket)
    documents = (
        pipeline
        | f"{split}: units" >> beam.Create(source.units())
        | f"{split}: read, tokenize" >> beam.ParDo(read).with_outputs(COUNTS, main="documents")
    )
    examples = (
        documents.documents
        | f"{split}: buckets" >> beam.GroupByKey()
        | f"{split}: examples"
        >> beam.ParDo(BucketExamples(recipe, seed, split, len(paths))).with_outputs(
            COUNTS, main="records"
        )
    )
    _ = (
        examples.records
        | f"{split}: shards" >> beam.GroupByKey()
        | f"{split}: write" >> beam.Map(write_shard, paths, work_dir, split)
    )
    _ = (
        (documents[COUNTS], examples[COUNTS])
        | f"{split}: all counts" >> beam.Flatten()
        | f"{split}: add counts" >> beam.CombineGlobally(stages.add_counts)
        | f"{split}: save counts"
        >> beam.Map(lambda counts: stages.save_counts(stages.counts_path(work_dir, split), counts))
    )


def run(
    sources: Sequence[stages.Source],
    paths: Mapping[str, Sequence[str]],
    recipe: Recipe,
    *,
    vocab: str,
    lowercase: bool,
    seed: int,
    documents_per_bucket: int,
    work_dir: str,
    runner: str,
    beam_options: Sequence[str] = (),
) -> dict[str, tuple[list[stages.ShardMeta | None], dict[str, int]]]:
    """Run every split's stages in one pipeline; per split, each shard's metadata (None for a
    shard no example hashed to) and the counts."""
    options = PipelineOptions(list(beam_options), runner=runner)
    with beam.Pipeline(options=options) as pipeline:
        for source in sources:
            add_split(
                pipeline,
                source,
                paths[source.split],
                recipe,
                vocab=vocab,
                lowercase=lowercase,
                seed=seed,
                documents_per_bucket=documents_per_bucket,
                work_dir=work_dir,
            )
    results = {}
    for source in sources:
        split = source.split
        metas = [
            stages.ShardMeta.load(path) if os.path.exists(path) else None
            for path in (stages.meta_path(work_dir, split, k) for k in range(len(paths[split])))
        ]
        counts = stages.load_counts(stages.counts_path(work_dir, split))
        results[split] = (metas, stages.add_counts([stages.empty_counts(), counts]))
    return results
