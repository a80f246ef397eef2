"""Published results (benchmarks/lib/records.py): what a results file records and where it goes, and
every marked block of the README and docs being exactly the rendering of the published files."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys

import pytest

from tests.paths import ROOT


@pytest.fixture(scope="module")
def results(load_benchmark):
    return load_benchmark("lib.records")


@pytest.fixture(scope="module")
def tables(load_benchmark):
    return load_benchmark("lib.blocks")


def test_every_block_in_the_docs_is_its_results_files_rendering():
    command = [sys.executable, "-m", "benchmarks", "--check"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, f"run `python -m benchmarks --docs`: {done.stdout}{done.stderr}"


def test_the_readme_and_each_results_page_block_are_rendered(tables):
    blocks = {}
    for path in tables.doc_paths():
        with open(path, encoding="utf-8") as f:
            for name in tables.BLOCK.findall(f.read()):
                blocks.setdefault(name[1], []).append(os.path.relpath(path, ROOT))
    assert blocks.get("readme") == ["README.md"]
    missing = set(tables.BLOCKS) - set(blocks)
    assert not missing, f"blocks no doc shows: {sorted(missing)}"


def test_a_changed_figure_changes_its_block(tables):
    record = tables.published("packed_vs_padded")
    record["result"]["cases"][0]["speedup"] += 1.0
    changed = lambda name: record if name == "packed_vs_padded" else tables.published(name)
    text = (
        "<!-- results:packed_vs_padded -->\n\n"
        + tables.BLOCKS["packed_vs_padded"](tables.published)
        + "\n\n<!-- /results -->"
    )
    assert tables.render(text, "doc", tables.published)[1] == []
    new, names = tables.render(text, "doc", changed)
    speedup = record["result"]["cases"][0]["speedup"]
    assert names == ["packed_vs_padded"] and f"{speedup:.2f}x" in new


def test_an_unknown_block_is_an_error_naming_the_known_ones(tables):
    with pytest.raises(ValueError, match=r"no block named 'nope'.*packing_bench"):
        tables.render("<!-- results:nope -->\n<!-- /results -->", "doc.md")


def test_publish_records_the_run_where_the_environment_says(results, benchmark_results_dir, capsys):
    argv = ["/elsewhere/benchmarks/step_cost.py", "--rows=1,2", "--json"]
    results.publish("probe", {"speedup": 2.0}, argv)
    assert capsys.readouterr().out.splitlines()[-1] == '{"speedup": 2.0}'  # the JSON line
    with open(os.path.join(benchmark_results_dir, "probe.json")) as f:
        record = json.load(f)
    assert record["command"] == "python -m benchmarks.step_cost --rows=1,2 --json"
    assert record["result"] == {"speedup": 2.0}
    when = datetime.datetime.fromisoformat(record["date"])
    assert when.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.UTC) - when) < datetime.timedelta(minutes=5)
    assert set(record["machine"]) == {"cpu", "cores", "platform", "jax"}
    assert record["machine"]["cores"] == os.cpu_count()
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", record["commit"]), record["commit"]
    assert not os.path.exists(os.path.join(results.PUBLISHED, "probe.json"))


def test_a_rerun_is_a_new_record_that_keeps_the_runs_before_it(results, benchmark_results_dir):
    for speedup in (1.0, 2.0, 3.0):
        results.publish("rerun_probe", {"speedup": speedup}, ["benchmarks/step_cost.py"])
    record = results.read("rerun_probe")
    assert record["result"] == {"speedup": 3.0}
    earlier = record["earlier_runs"]
    assert [run["result"]["speedup"] for run in earlier] == [1.0, 2.0]  # oldest first
    assert all("earlier_runs" not in run and run["date"] for run in earlier)


def test_a_commit_outside_git_is_unknown(results, tmp_path):
    assert results.commit(str(tmp_path)) == "unknown"


def test_publish_run_publishes_a_finished_runs_metrics(results, benchmark_results_dir, tmp_path):
    final = {"step": 10, "preempted": False, "baseline": 0.07, "eval": {"masked_lm_accuracy": 0.3}}
    (tmp_path / "final_metrics.json").write_text(json.dumps(final))
    command = "python -m bert_flax.train --config=configs/cpu_pretrain_soap.py"
    path = results.publish_run(str(tmp_path), "run", command)
    assert path == os.path.join(benchmark_results_dir, "run.json")
    record = results.read("run")
    assert record["command"] == command and record["result"] == final
    (tmp_path / "final_metrics.json").write_text(json.dumps({**final, "preempted": True}))
    with pytest.raises(SystemExit, match="ended on its own"):
        results.publish_run(str(tmp_path), "run", command)


REFERENCE_DOCS = ("packing", "data", "model", "training", "optim", "block_sparse", "profile")
DATED = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b(?:on|at) \d\d:\d\d\b")


@pytest.mark.parametrize("doc", REFERENCE_DOCS)
def test_reference_docs_leave_dated_measurements_to_the_results_page(doc):
    with open(os.path.join(ROOT, "docs", f"{doc}.md"), encoding="utf-8") as f:
        dated = [line for line in f if DATED.search(line)]
    assert not dated, f"docs/{doc}.md: move dated runs to docs/results.md: {dated[:3]}"


def test_publish_run_publishes_a_demos_summary(results, benchmark_results_dir, tmp_path):
    (tmp_path / "demo_summary.json").write_text(json.dumps({"summary": "Demo summary\n  x"}))
    results.publish_run(str(tmp_path), "demo", "make demo")
    assert results.read("demo")["result"] == {"summary": "Demo summary\n  x"}


# A measured figure: a decimal, a percentage, a thousands separator, a time, a size or a ratio.
FIGURE = re.compile(
    r"\d\.\d|\d ?%|\d,\d{3}|\b\d+ ?(?:s|ms|x|min|minutes|seconds|hours|GB|MB|GiB|MiB)\b"
)


def hand_typed_figures(text: str) -> list[str]:
    """The lines of `text` outside its results blocks and code fences that quote a figure."""
    outside = re.sub(r"<!-- results:.*?<!-- /results -->|```.*?```", "", text, flags=re.S)
    return [line for line in outside.splitlines() if FIGURE.search(line)]


def test_the_results_page_holds_only_figures_its_files_render():
    with open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8") as f:
        typed = hand_typed_figures(f.read())
    assert not typed, (
        f"docs/results.md: publish these as results files, or move them to docs/notes/: {typed[:3]}"
    )


def test_a_hand_typed_figure_is_found_outside_the_blocks_only():
    block = "<!-- results:x -->\n1.5x\n<!-- /results -->\n```bash\nrun --minutes=0.5\n```\n"
    assert hand_typed_figures(block + "at depth 3 of 8\n") == []
    assert hand_typed_figures(block + "packed 1.93x faster\n") == ["packed 1.93x faster"]
