r"""Check one epoch of the packed pipeline against the unpacked examples.

    python -m bert_flax.data.verify_packing --data_dir=/tmp/sotu128 [--strategies=FILE] [--json]

Reads every example of the split straight from the records (protobuf parsing, independent of the
pipeline), runs one epoch of ``packed_dataset``, unpacks every row by its segment ids and compares
the two multisets. Reports examples in and out, missing, duplicated and corrupted (positions not
restarting at 0, segment ids that are not contiguous 1..k so tokens of different sequences could
attend to each other, a masked position outside its own sequence, [CLS] not at an nsp_position,
non-zero padding), predicted and achieved efficiency, and rows per second. Exits 1 if anything is
missing, duplicated or corrupted.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from absl import flags

from bert_flax import errors
from bert_flax.input_pipeline import datasets, records
from bert_flax.input_pipeline.contract import PreparedData, load_strategies
from bert_flax.input_pipeline.record_index import RecordIndex

ExampleKey = tuple[bytes, bytes, bytes, bytes, int]


def example_key(
    input_ids, token_type_ids, masked_lm_positions, masked_lm_ids, next_sentence_label
) -> ExampleKey:
    """A hashable identity of an example (all its features)."""
    as_bytes = lambda x: np.asarray(x, dtype=np.int32).tobytes()
    return (
        as_bytes(input_ids),
        as_bytes(token_type_ids),
        as_bytes(masked_lm_positions),
        as_bytes(masked_lm_ids),
        int(next_sentence_label),
    )


def reference_examples(files: Sequence[str]) -> collections.Counter:
    """The multiset of examples in ``files``, parsed record by record with protobuf."""
    counter: collections.Counter = collections.Counter()
    for record in tf.data.TFRecordDataset(list(files)).as_numpy_iterator():
        feature = tf.train.Example.FromString(record).features.feature
        values = {k: list(feature[k].int64_list.value) for k in feature}
        counter[
            example_key(
                values["input_ids"],
                values["token_type_ids"],
                values["masked_lm_positions"],
                values["masked_lm_ids"],
                values["next_sentence_labels"][0],
            )
        ] += 1
    return counter


def sequence_runs(row: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(starts, ends) of the row's sequences, and what is wrong with its token fields: padding
    only at the end, segment ids in runs 1..k, zeros in the padding, positions restarting at 0."""
    problems: list[str] = []
    segments, positions = row["segment_ids"], row["positions"]
    real = segments > 0
    num_real = int(real.sum())
    if np.any(real[num_real:]) or not np.all(real[:num_real]):
        problems.append("padding is not only at the end of the row")
    starts = np.flatnonzero(np.diff(np.concatenate([[0], segments])) != 0)
    starts = starts[segments[starts] > 0]
    labels = segments[starts]
    if not np.array_equal(labels, np.arange(1, len(starts) + 1)):
        problems.append(
            f"segment ids are not contiguous runs 1..k (runs {labels.tolist()}): tokens of "
            "different sequences would attend to each other"
        )
    for name in ("input_ids", "token_type_ids", "positions"):
        if np.any(row[name][~real] != 0):
            problems.append(f"{name} is non-zero in the padding")
    ends = np.append(starts[1:], num_real) if len(starts) else starts
    expected_positions = np.zeros_like(positions)
    for s, e in zip(starts, ends):
        expected_positions[s:e] = np.arange(e - s)
    if not np.array_equal(positions[real], expected_positions[real]):
        problems.append("positions do not restart at 0 and count up in each sequence")
    return starts, ends, problems


def slot_problems(row: Mapping[str, np.ndarray], starts: np.ndarray, cls_id: int) -> list[str]:
    """What is wrong with the per-sequence slots: the sequence mask, each [CLS] position, and
    zeros in the empty slots."""
    problems: list[str] = []
    k, mask, cls = len(starts), row["sequence_mask"], row["cls_positions"]
    slots = len(mask)
    if k > slots or not np.array_equal(mask, (np.arange(slots) < k).astype(mask.dtype)):
        problems.append(f"sequence_mask {mask.tolist()} does not match {k} sequences")
    for d in range(min(k, slots)):
        if cls[d] != starts[d] or row["input_ids"][cls[d]] != cls_id:
            problems.append(f"cls_positions[{d}]={cls[d]} is not the [CLS] of sequence {d + 1}")
    if np.any(cls[k:] != 0) or np.any(row["next_sentence_labels"][k:] != 0):
        problems.append("empty sequence slots are not zero")
    return problems


def prediction_problems(row: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[str]]:
    """The row's real masked positions, and what is wrong with its prediction fields: weights
    ones then zeros, zero padding, every position inside a sequence."""
    problems: list[str] = []
    weights = row["masked_lm_weights"]
    num_predictions = int((weights > 0).sum())
    positions, ids = row["masked_lm_positions"], row["masked_lm_ids"]
    if not np.array_equal(
        weights, (np.arange(len(weights)) < num_predictions).astype(weights.dtype)
    ):
        problems.append("masked_lm_weights are not ones followed by zeros")
    if np.any(positions[num_predictions:] != 0) or np.any(ids[num_predictions:] != 0):
        problems.append("padding masked positions are not zero")
    predicted = positions[:num_predictions]
    inside = (predicted >= 0) & (predicted < len(row["input_ids"]))
    if not np.all(inside) or np.any(row["segment_ids"][predicted[inside]] == 0):
        problems.append("a masked position lies outside every sequence")
    return predicted, problems


def unpack_row(row: Mapping[str, np.ndarray], cls_id: int) -> tuple[list[ExampleKey], list[str]]:
    """The examples packed in one row, and what is wrong with the row (empty if nothing)."""
    starts, ends, problems = sequence_runs(row)
    problems += slot_problems(row, starts, cls_id)
    predicted, prediction_errors = prediction_problems(row)
    problems += prediction_errors
    if problems:
        return [], problems
    segments, ids = row["segment_ids"], row["input_ids"]
    owners = segments[predicted]
    examples = [
        example_key(
            ids[s:e],
            row["token_type_ids"][s:e],
            predicted[owners == d + 1] - s,
            row["masked_lm_ids"][: len(predicted)][owners == d + 1],
            row["next_sentence_labels"][d],
        )
        for d, (s, e) in enumerate(zip(starts, ends))
    ]
    if np.any(np.diff(owners) < 0):
        problems.append("masked positions are not grouped by sequence in row order")
    return examples, problems


def compare(reference: collections.Counter, unpacked: Iterable[ExampleKey]) -> dict[str, int]:
    """Missing, duplicated and unknown examples of ``unpacked`` against ``reference``."""
    seen = collections.Counter(unpacked)
    missing = sum((reference - seen).values())
    extra = seen - reference
    unknown = sum(c for key, c in extra.items() if key not in reference)
    return {
        "examples_in": sum(reference.values()),
        "examples_out": sum(seen.values()),
        "missing": missing,
        "duplicated": sum(extra.values()) - unknown,
        "unknown": unknown,
    }


def verify(
    data_dir: str,
    *,
    split: str = "train",
    strategies: str | None = None,
    batch_size: int = 64,
    max_sequences_per_pack: int = 3,
    streaming: bool = False,
    seed: int = 0,
    max_problems: int = 5,
) -> dict:
    """Run one epoch and return the report (see the module docstring)."""
    data = PreparedData.load(data_dir)
    cls_id, max_seq_length = data.cls_id, data.max_seq_length
    RecordIndex.load_or_build(data_dir, split)  # names a truncated or foreign shard
    reference = reference_examples(records.find_shards(data_dir, split))
    options = datasets.InputOptions(
        split=split,
        strategies=strategies,
        max_sequences_per_pack=max_sequences_per_pack,
        streaming=streaming,
        seed=seed,
        repeat=False,
        drop_remainder=False,
        process_index=0,
        process_count=1,
    )
    dataset = datasets.packed_dataset(data_dir, batch_size, options)
    unpacked: list[ExampleKey] = []
    problems: list[str] = []
    corrupted_rows = rows = real_tokens = 0
    seconds = 0.0  # time spent waiting for the pipeline, not unpacking
    iterator = dataset.as_numpy_iterator()
    while True:
        start = time.perf_counter()
        batch = next(iterator, None)
        seconds += time.perf_counter() - start
        if batch is None:
            break
        for r in range(len(batch["input_ids"])):
            examples, row_problems = unpack_row({k: v[r] for k, v in batch.items()}, cls_id)
            unpacked.extend(examples)
            if row_problems:
                corrupted_rows += 1
                problems.extend(f"row {rows}: {p}" for p in row_problems)
            rows += 1
        real_tokens += int((batch["segment_ids"] > 0).sum())
    report = compare(reference, unpacked)
    predicted = None
    if not streaming:
        strategy_set = load_strategies(
            data_dir, strategies, max_seq_length, max_sequences_per_pack, "nnlshp"
        )
        predicted = float(strategy_set.metrics().efficiency)
    report.update(
        corrupted_rows=corrupted_rows,
        problems=problems[:max_problems],
        rows=rows,
        split=split,
        predicted_efficiency=predicted,
        achieved_efficiency=100.0 * real_tokens / max(1, rows * max_seq_length),
        rows_per_second=rows / seconds if seconds > 0 else float("inf"),
        ok=report["missing"] == report["duplicated"] == report["unknown"] == corrupted_rows == 0,
    )
    return report


def format_report(report: Mapping) -> str:
    predicted = report["predicted_efficiency"]
    lines = [
        f"examples in {report['examples_in']}, out {report['examples_out']}: missing "
        f"{report['missing']}, duplicated {report['duplicated']}, unknown {report['unknown']}, "
        f"corrupted rows {report['corrupted_rows']}",
        f"rows {report['rows']}, efficiency achieved {report['achieved_efficiency']:.2f}% "
        + (
            "(streaming)"
            if predicted is None
            else f"(the strategies predict {predicted:.2f}% on the train histogram)"
        )
        + f", {report['rows_per_second']:.0f} rows/s",
        *report["problems"],
        "OK" if report["ok"] else "FAILED",
    ]
    return "\n".join(lines)


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("data_dir", None, "Output of create_pretraining_data.")
    flags.DEFINE_string("strategies", None, "strategies.json (default DATA_DIR/strategies.json).")
    flags.DEFINE_string("split", "train", "Split to check.")
    flags.DEFINE_integer("batch_size", 64, "Rows per batch.")
    flags.DEFINE_integer("max_sequences_per_pack", 3, "Sequence slots per row (D).")
    flags.DEFINE_bool("streaming", False, "Check the online packer instead of the strategies.")
    flags.DEFINE_bool("json", False, "Print the report as JSON.")


def main(argv: Sequence[str]) -> None:
    del argv
    report = verify(
        FLAGS.data_dir,
        split=FLAGS.split,
        strategies=FLAGS.strategies,
        batch_size=FLAGS.batch_size,
        max_sequences_per_pack=FLAGS.max_sequences_per_pack,
        streaming=FLAGS.streaming,
    )
    print(json.dumps(report, indent=2) if FLAGS.json else format_report(report))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    define_flags()
    flags.mark_flag_as_required("data_dir")
    errors.run(main)
