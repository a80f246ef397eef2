"""A finished run is reused only when it is the same run: same config, data and code
(`finished.reusable_run`, `bert_flax.runs.fingerprint`); another run in its workdir is moved
aside."""

from __future__ import annotations

import json
import logging
import os

from bert_flax.runs import fingerprint
from bert_flax.runs.finished import FINAL_METRICS, FinalMetrics, reusable_run
from bert_flax.tasks import PreTrainingTask
from bert_flax.train import loop


def reusable(workdir: str, config) -> dict | None:
    return reusable_run(workdir, config, PreTrainingTask(config))


def warnings_of(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_finished_run_is_reused_and_one_of_another_config_trained_afresh(
    make_config, tmp_path, caplog
):
    workdir = str(tmp_path / "run")
    loop.train_and_evaluate(make_config(**{"train.steps": 2}), workdir)
    with open(os.path.join(workdir, FINAL_METRICS)) as f:
        assert set(json.load(f)) == FinalMetrics.__required_keys__  # what the type says it holds

    reused = reusable(workdir, make_config(**{"train.steps": 2}))  # an equal config
    assert reused["reused"] and reused["step"] == 2

    other = make_config(**{"train.steps": 2, "schedule.learning_rate": 2e-2})
    with caplog.at_level(logging.WARNING):
        assert reusable(workdir, other) is None
    assert "schedule.learning_rate 0.01 -> 0.02" in warnings_of(caplog)
    assert not os.path.exists(workdir)
    assert os.path.isfile(os.path.join(f"{workdir}.stale-1", FINAL_METRICS))  # kept
    final = loop.train_and_evaluate(other, workdir)
    assert final["steps_this_run"] == 2  # from the start, not the old run's end
    assert reusable(workdir, other)["reused"]


def fake_run(workdir: str, config, *, preempted: bool = False) -> None:
    """A workdir holding a finished (or interrupted) run of `config`, as training leaves it."""
    os.makedirs(workdir)
    fingerprint.write(workdir, fingerprint.of_run(config, PreTrainingTask(config)))
    with open(os.path.join(workdir, FINAL_METRICS), "w") as f:
        json.dump({"step": 4, "preempted": preempted}, f)


def test_other_data_or_code_set_a_run_aside(make_config, tmp_path, monkeypatch, caplog):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    summary = {"options": {"max_seq_length": 64, "max_predictions_per_seq": 5}}
    summary["options"]["masked_lm_prob"] = 0.15
    (data_dir / "summary.json").write_text(json.dumps(summary))
    config = make_config(str(data_dir))
    workdir = str(tmp_path / "run")
    fake_run(workdir, config)
    assert reusable(workdir, config)["reused"]

    summary["options"]["dupe_factor"] = 2  # the data were prepared again, otherwise
    (data_dir / "summary.json").write_text(json.dumps(summary))
    with caplog.at_level(logging.WARNING):
        assert reusable(workdir, config) is None
    assert "data (" in warnings_of(caplog) and os.path.isdir(f"{workdir}.stale-1")

    fake_run(workdir, config)
    monkeypatch.setattr(fingerprint, "code_version", lambda: "edited")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert reusable(workdir, config) is None
    assert "code (" in warnings_of(caplog) and os.path.isdir(f"{workdir}.stale-2")

    fake_run(workdir, config, preempted=True)  # the same run, interrupted: resumed in place
    assert reusable(workdir, config) is None and os.path.isdir(workdir)
