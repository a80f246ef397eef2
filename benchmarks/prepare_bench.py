r"""Preparing pre-training data at growing corpus sizes: peak memory, throughput, and Apache
Beam against the local runner, side by side in one run.

    python -m benchmarks.prepare_bench --workdir=/tmp/prepare_bench --documents=2000,8000,32000

The corpora are synthetic but made of real text: documents of --paragraphs paragraphs drawn at
random (seeded) from the bundled State of the Union speeches, written in the blank-line layout
(one document after another, --documents_per_file to a file, like a Wikipedia extraction).
Each size is first converted to a fresh TFDS dataset (`open_corpus`) in one process, then
prepared by `create_pretraining_data` in another (so each `ru_maxrss` is that phase's peak),
with --documents_per_bucket documents per NSP bucket and a number of train shards that grows
with the corpus (one per --documents_per_shard documents), as a user sizes them for bounded
memory. Reported per size: the peak resident memory of each phase (and of the largest example
worker), the same interpreter's peak with the imports alone, examples, the bytes of records
written (what the previous design held in memory as Python lists), and examples/s. With
--reference_revision, each size is prepared again right after by that revision's code (a git
worktree), for peak memory and examples/s side by side.

Beam: the smallest corpus is prepared again with `--runner=DirectRunner` (in-process, and with
2 worker processes) right after the local runner; the table gives examples/s of each and whether
every shard, index and histogram is byte-identical to the local runner's.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, items_table, mb, source, whole
from bert_flax.data import corpus

PROBE = r"""
import json, resource, shlex, sys
from bert_flax.data.create_pretraining_data import create_pretraining_data
args = json.loads(sys.argv[1])
phase = args.pop("phase")
summary = None
if phase == "convert":  # the folder -> TFDS dataset conversion alone
    from bert_flax.data.create_pretraining_data import open_corpus
    open_corpus(args["input"], tfds_data_dir=args["tfds_data_dir"], document_mode="blank_line")
elif phase == "prepare":
    try:  # an options object here; keyword arguments at a --reference_revision before it
        from bert_flax.data.create_pretraining_data import PretrainingDataOptions
    except ImportError:
        summary = create_pretraining_data(progress=False, **args)
    else:
        args["beam_options"] = shlex.join(args.get("beam_options", []))
        summary = create_pretraining_data(PretrainingDataOptions(**args), progress=False)
usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"peak_rss_mb": usage, "worker_peak_rss_mb": children, "summary": summary}))
"""


def write_corpus(folder: str, num_documents: int, paragraphs: int, per_file: int) -> None:
    """``num_documents`` documents of ``paragraphs`` real paragraphs each, blank-line layout."""
    if os.path.exists(os.path.join(folder, "DONE")):
        return
    os.makedirs(folder, exist_ok=True)
    pool = [
        paragraph
        for document in corpus.read_documents(corpus.bundled_corpus_dir())
        for paragraph in document.paragraphs
    ]
    rng = random.Random(num_documents)
    for start in range(0, num_documents, per_file):
        documents = [
            "\n".join(rng.choice(pool) for _ in range(paragraphs))
            for _ in range(start, min(start + per_file, num_documents))
        ]
        with open(os.path.join(folder, f"part-{start // per_file:05d}.txt"), "w") as f:
            f.write("\n\n".join(documents) + "\n")
    open(os.path.join(folder, "DONE"), "w").close()


def probe(arguments: dict, code_dir: str | None = None) -> dict:
    """Run the probe in a fresh process; with ``code_dir``, on that checkout's code."""
    env = dict(os.environ)
    if code_dir:  # ahead of the editable install of this checkout (and `-c` puts cwd first)
        env["PYTHONPATH"] = os.pathsep.join([code_dir, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(arguments)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=code_dir,
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def checkout(revision: str, folder: str) -> str:
    """A worktree of this repository at ``revision`` (the reference design to compare with)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(folder):
        subprocess.run(["git", "-C", root, "worktree", "add", "-f", folder, revision], check=True)
    return folder


def record_bytes(data_dir: str) -> int:
    return sum(
        os.path.getsize(os.path.join(data_dir, name))
        for name in os.listdir(data_dir)
        if name.endswith(".tfrecord")
    )


def examples_of(summary: dict) -> int:
    return sum(split["examples"] for split in summary["splits"].values())


def identical(first: str, second: str) -> bool:
    names = [n for n in os.listdir(first) if n.endswith(".tfrecord")]
    names += ["histogram.txt", "index/train.npz", "index/validation.npz"]
    return all(
        filecmp.cmp(os.path.join(first, n), os.path.join(second, n), shallow=False) for n in names
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/prepare_bench")
    parser.add_argument("--documents", default="2000,8000,32000")
    parser.add_argument("--paragraphs", type=int, default=30)
    parser.add_argument("--documents_per_file", type=int, default=1000)
    parser.add_argument("--documents_per_bucket", type=int, default=1000)
    parser.add_argument("--documents_per_shard", type=int, default=500)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument(
        "--reference_revision",
        default="",
        help="Also prepare each size with the code of this git revision, right after ours "
        "(e098f30: the last one that held a split's examples in memory).",
    )
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    args = parser.parse_args()
    sizes = [int(n) for n in args.documents.split(",")]

    def arguments(size: int, output: str, **extra) -> dict:
        return {
            "input": os.path.join(args.workdir, f"corpus_{size}"),
            "output_dir": os.path.join(args.workdir, output),
            "document_mode": "blank_line",
            "max_seq_length": args.max_seq_length,
            "dupe_factor": 1,
            "documents_per_bucket": args.documents_per_bucket,
            "num_train_shards": math.ceil(size / args.documents_per_shard),
            "num_workers": args.num_workers,
            "tfds_data_dir": os.path.join(args.workdir, f"tfds_{size}"),
            **extra,
        }

    reference_dir = ""
    if args.reference_revision:
        folder = os.path.join(args.workdir, f"reference_{args.reference_revision}")
        reference_dir = checkout(args.reference_revision, folder)
    baseline = probe({"phase": "imports"})["peak_rss_mb"]
    print(f"imports alone: {baseline:.0f} MB peak resident memory")
    rows = []
    for size in sizes:
        write_corpus(
            os.path.join(args.workdir, f"corpus_{size}"),
            size,
            args.paragraphs,
            args.documents_per_file,
        )
        shutil.rmtree(os.path.join(args.workdir, f"tfds_{size}"), ignore_errors=True)
        convert = probe(arguments(size, f"local_{size}", phase="convert"))
        result = probe(arguments(size, f"local_{size}", phase="prepare"))
        summary = result["summary"]
        rows.append(
            {
                "documents": size,
                "examples": examples_of(summary),
                "shards": len(summary["splits"]["train"]["shards"]),
                "record_mb": record_bytes(arguments(size, f"local_{size}")["output_dir"]) / 2**20,
                "convert_peak_rss_mb": convert["peak_rss_mb"],
                "peak_rss_mb": result["peak_rss_mb"],
                "worker_peak_rss_mb": result["worker_peak_rss_mb"],
                "examples_per_s": summary["examples_per_second"],
            }
        )
        if reference_dir:  # the same arguments, less the options the reference lacks
            reference = arguments(size, f"reference_{size}", phase="prepare")
            del reference["documents_per_bucket"]
            result = probe(reference, reference_dir)
            if "runner" in result["summary"]:
                raise RuntimeError(f"The reference probe ran this checkout's code, not {folder}.")
            rows[-1]["reference_peak_rss_mb"] = result["peak_rss_mb"]
            rows[-1]["reference_examples_per_s"] = result["summary"]["examples_per_second"]
        print(json.dumps(rows[-1]))

    smallest = sizes[0]
    local_dir = arguments(smallest, f"local_{smallest}")["output_dir"]
    beam = {}
    for name, options in (
        ("direct", []),
        (
            "direct_2_processes",
            ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        ),
    ):
        local = probe(arguments(smallest, f"local_{smallest}", phase="prepare"))["summary"]
        output = f"beam_{name}_{smallest}"
        beam_arguments = arguments(smallest, output, runner="DirectRunner", beam_options=options)
        summary = probe({**beam_arguments, "phase": "prepare"})["summary"]
        beam[name] = {
            "local_examples_per_s": local["examples_per_second"],
            "beam_examples_per_s": summary["examples_per_second"],
            "beam_over_local": summary["examples_per_second"] / local["examples_per_second"],
            "identical": identical(local_dir, arguments(smallest, output)["output_dir"]),
        }
        print(json.dumps({name: beam[name]}))

    print()
    print(
        "| documents | examples | train shards | records MB | conversion peak RSS MB "
        f"| peak RSS MB (imports {baseline:.0f}) | largest worker MB | examples/s "
        "| reference peak RSS MB | reference examples/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        reference = (
            f"{row['reference_peak_rss_mb']:.0f} | {row['reference_examples_per_s']:,.0f}"
            if "reference_peak_rss_mb" in row
            else "- | -"
        )
        print(
            f"| {row['documents']:,} | {row['examples']:,} | {row['shards']} | "
            f"{row['record_mb']:.0f} | {row['convert_peak_rss_mb']:.0f} | {row['peak_rss_mb']:.0f} "
            f"| {row['worker_peak_rss_mb']:.0f} | {row['examples_per_s']:,.0f} | {reference} |"
        )
    print()
    print(f"Beam DirectRunner on {smallest:,} documents, each right after the local runner:")
    print("| Beam mode | local examples/s | Beam examples/s | Beam / local | byte-identical |")
    print("|---|---|---|---|---|")
    for name, row in beam.items():
        print(
            f"| {name} | {row['local_examples_per_s']:,.0f} | {row['beam_examples_per_s']:,.0f} "
            f"| {row['beam_over_local']:.2f} | {row['identical']} |"
        )
    if args.json:
        publish("prepare_bench", {"imports_rss_mb": baseline, "sizes": rows, "beam": beam})


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


PREPARE_COLUMNS: Columns = {
    "documents": lambda s: whole(s["documents"]),
    "examples": lambda s: whole(s["examples"]),
    "records": lambda s: mb(s["record_mb"]),
    "conversion to TFDS: peak RSS": lambda s: mb(s["convert_peak_rss_mb"]),
    "examples phase: peak RSS": lambda s: mb(s["peak_rss_mb"]),
    "previous design: peak RSS": lambda s: mb(s["reference_peak_rss_mb"]),
    "examples/s ours / previous": lambda s: (
        f"{whole(s['examples_per_s'])} / {whole(s['reference_examples_per_s'])} "
        f"({s['examples_per_s'] / s['reference_examples_per_s']:.2f})"
    ),
}


BEAM_MODES = {
    "direct": "in-process (`DirectRunner`)",
    "direct_2_processes": "2 processes (`--direct_num_workers=2 "
    "--direct_running_mode=multi_processing`)",
}


BEAM_COLUMNS: Columns = {
    "Beam mode": lambda b: BEAM_MODES[b["mode"]],
    "local examples/s": lambda b: whole(b["local_examples_per_s"]),
    "Beam examples/s": lambda b: whole(b["beam_examples_per_s"]),
    "Beam / local": lambda b: f"{b['beam_over_local']:.2f}",
    "byte-identical": lambda b: "yes" if b["identical"] else "no",
}


def prepare_block(read: Read) -> str:
    r = read("prepare_bench")["result"]
    beam = [{"mode": mode, **b} for mode, b in r["beam"].items()]
    return (
        f"{source('prepare_bench', read)}\n\nPeak resident memory of each phase (the imports "
        f"alone: {mb(r['imports_rss_mb'])}):\n\n{items_table(r['sizes'], PREPARE_COLUMNS)}\n\n"
        f"Beam on the smallest corpus, each run right after the local runner:\n\n"
        f"{items_table(beam, BEAM_COLUMNS)}"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"prepare_bench": prepare_block}


if __name__ == "__main__":
    main()
