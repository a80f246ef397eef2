"""The GLUE runner on a tiny GLUE folder: each task fine-tuned over the grid, the best dev run
kept (as the runs' own metrics.jsonl say), the table's means, and the submission files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_flax import glue

TINY = [
    "model.num_layers=1", "model.max_position_embeddings=64", "data.max_seq_length=32",
    "data.packed=False", "train.batch_size=8", "train.epochs=1.0", "eval.evaluations=2",
    "log.plots=False",
]  # fmt: skip
RATES = (1e-3, 1e-5)


def best_evaluation(run_dir: str, metric: str) -> dict:
    """The evaluation of the run with the highest `metric`, read from its metrics.jsonl."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        evaluations = [r for r in map(json.loads, f) if r["split"] == "eval"]
    return max(evaluations, key=lambda r: r[metric])


def test_the_runner_keeps_each_tasks_best_run_and_averages_the_table(glue_dir, tmp_path):
    workdir = str(tmp_path)
    setup = {"size": "cpu", "glue_dir": glue_dir, "init_from": "", "settings": TINY}
    tasks = glue.read_tasks(["mrpc", "wnli"], **setup)
    summary = glue.run_glue(tasks, RATES, workdir, **setup)
    assert json.loads((tmp_path / "glue.json").read_text()) == summary
    scores = {}
    for task, main, metrics in (("mrpc", "f1", ("f1", "accuracy")), ("wnli", "accuracy", ())):
        best = {
            rate: best_evaluation(str(tmp_path / task / f"lr_{rate:g}"), main) for rate in RATES
        }
        rate = max(RATES, key=lambda r: best[r][main])
        result = summary["tasks"][task]
        assert result["learning_rate"] == rate
        values = [best[rate][name] for name in metrics or (main,)]
        assert result["dev"]["score"] == pytest.approx(np.mean(values))
        scores[task] = np.mean(values)
    assert summary["score"] == pytest.approx(scores["mrpc"])  # WNLI left out
    assert summary["score_with_wnli"] == pytest.approx(np.mean(list(scores.values())))
    assert sorted(os.listdir(tmp_path / "submission")) == ["MRPC.tsv", "WNLI.tsv"]
    table = (tmp_path / "glue.md").read_text()
    assert f"| mrpc | {summary['tasks']['mrpc']['learning_rate']:g} |" in table
    assert f"GLUE dev score {100 * summary['score']:.1f}" in table


def test_the_command_writes_the_table_and_submission_files(glue_dir, tmp_path):
    settings = [f"--set={setting}" for setting in TINY]
    done = subprocess.run(
        [sys.executable, "-m", "bert_flax.glue", f"--glue_dir={glue_dir}", "--tasks=rte",
         "--learning_rates=1e-3", f"--workdir={tmp_path}", *settings],
        capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "glue.json").read_text())
    assert list(summary["tasks"]) == ["rte"]
    lines = (tmp_path / "submission" / "RTE.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) > 1
