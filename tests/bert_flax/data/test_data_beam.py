"""create_pretraining_data on Apache Beam (the command line, DirectRunner in multi-processing
mode) writes byte for byte what the local runner writes, and both verify."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys

import pytest

from bert_flax.data import verify_packing
from bert_flax.data.create_pretraining_data import PretrainingDataOptions, create_pretraining_data
from bert_flax.input_pipeline import records

pytest.importorskip("apache_beam")

OPTIONS = dict(max_seq_length=64, dupe_factor=2, num_train_shards=3, documents_per_bucket=3)
TIMINGS = ("tokenize_seconds", "example_seconds")


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory, speeches_dir) -> str:
    """Eight speeches cut into paragraph-block documents: 3 buckets of train documents."""
    folder = tmp_path_factory.mktemp("blocks")
    for name in sorted(os.listdir(speeches_dir))[:8]:
        with open(os.path.join(speeches_dir, name)) as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        blocks = ["\n".join(lines[i : i + 12]) for i in range(0, len(lines), 12)][:3]
        (folder / name).write_text("\n\n".join(blocks))
    return str(folder)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, corpus_dir) -> tuple[str, str, dict, dict]:
    local = str(tmp_path_factory.mktemp("local"))
    beam = str(tmp_path_factory.mktemp("beam"))
    tfds_dir = str(tmp_path_factory.mktemp("tfds"))
    options = PretrainingDataOptions(
        input=corpus_dir,
        output_dir=local,
        document_mode="blank_line",
        num_workers=2,
        tfds_data_dir=tfds_dir,
        **OPTIONS,
    )
    local_summary = create_pretraining_data(options, progress=False)
    command = [
        sys.executable,
        "-m",
        "bert_flax.data.create_pretraining_data",
        f"--input={corpus_dir}",
        f"--output_dir={beam}",
        "--document_mode=blank_line",
        f"--tfds_data_dir={tfds_dir}",
        *(f"--{name}={value}" for name, value in OPTIONS.items()),
        "--runner=DirectRunner",
        "--beam_options=--direct_num_workers=2 --direct_running_mode=multi_processing",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train examples" in done.stdout
    with open(os.path.join(beam, "summary.json")) as f:
        return local, beam, local_summary, json.load(f)


def test_beam_writes_the_bytes_the_local_runner_writes(outputs):
    local, beam, local_summary, beam_summary = outputs
    train = local_summary["splits"]["train"]
    assert train["documents"] > 2 * OPTIONS["documents_per_bucket"]  # several buckets
    assert train["buckets"] >= 2 and len(train["shards"]) == OPTIONS["num_train_shards"]
    names = [
        *train["shards"],
        *local_summary["splits"]["validation"]["shards"],
        "histogram.txt",
        "index/train.npz",
        "index/validation.npz",
    ]
    assert records.existing_shards(beam, "train") == [
        os.path.join(beam, n) for n in train["shards"]
    ]
    for name in names:
        assert filecmp.cmp(os.path.join(local, name), os.path.join(beam, name), shallow=False), name
    for split in ("train", "validation"):
        ours = {k: v for k, v in local_summary["splits"][split].items() if k not in TIMINGS}
        assert beam_summary["splits"][split] == ours
    assert beam_summary["runner"] == "DirectRunner" and local_summary["runner"] == "local"
    assert not os.path.exists(os.path.join(beam, "work"))


def test_both_outputs_verify(outputs):
    local, beam, *_ = outputs
    for data_dir in (local, beam):
        report = verify_packing.verify(data_dir, batch_size=32)
        assert report["ok"], report
        assert report["examples_in"] == report["examples_out"] > 500
