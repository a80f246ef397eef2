"""Published results (benchmarks/results.py): what a results file records and where it goes, and
the README's headline table being exactly the rendering of the published files."""

from __future__ import annotations

import datetime
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKED = re.compile(r"^<!-- results:[^\n]*-->\n(.*?)\n<!-- /results -->$", re.S | re.M)


@pytest.fixture(scope="module")
def results(load_benchmark):
    return load_benchmark("results")


def test_the_readme_table_is_the_published_results(results):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        marked = MARKED.findall(f.read())
    assert len(marked) == 1, "README.md: one table between <!-- results: --> and <!-- /results -->"
    assert marked[0].strip() == results.readme_table(results.PUBLISHED), (
        "README.md: paste `python benchmarks/results.py --readme` between its results markers"
    )


def test_publish_records_the_run_where_the_environment_says(results, benchmark_results_dir, capsys):
    argv = ["/elsewhere/benchmarks/step_cost.py", "--rows=1,2", "--json"]
    results.publish("probe", {"speedup": 2.0}, argv)
    assert capsys.readouterr().out.splitlines()[-1] == '{"speedup": 2.0}'  # the JSON line
    with open(os.path.join(benchmark_results_dir, "probe.json")) as f:
        record = json.load(f)
    assert record["command"] == "python benchmarks/step_cost.py --rows=1,2 --json"
    assert record["result"] == {"speedup": 2.0}
    when = datetime.datetime.fromisoformat(record["date"])
    assert when.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.UTC) - when) < datetime.timedelta(minutes=5)
    assert set(record["machine"]) == {"cpu", "cores", "platform", "jax"}
    assert record["machine"]["cores"] == os.cpu_count()
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", record["commit"]), record["commit"]
    assert not os.path.exists(os.path.join(results.PUBLISHED, "probe.json"))


def test_a_commit_outside_git_is_unknown(results, tmp_path):
    assert results.commit(str(tmp_path)) == "unknown"


def test_publish_run_publishes_a_finished_runs_metrics(results, benchmark_results_dir, tmp_path):
    final = {"step": 10, "preempted": False, "baseline": 0.07, "eval": {"masked_lm_accuracy": 0.3}}
    (tmp_path / "final_metrics.json").write_text(json.dumps(final))
    command = "python -m bert_flax.main --config=configs/cpu_pretrain_soap.py"
    path = results.publish_run(str(tmp_path), "run", command)
    assert path == os.path.join(benchmark_results_dir, "run.json")
    record = results.read("run")
    assert record["command"] == command and record["result"] == final
    (tmp_path / "final_metrics.json").write_text(json.dumps({**final, "preempted": True}))
    with pytest.raises(SystemExit, match="ended on its own"):
        results.publish_run(str(tmp_path), "run", command)
