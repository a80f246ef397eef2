"""A run's final metrics read back and a workdir set aside (`bert_flax.runs.finished`); reusing a
finished run only when it is the same run trains one, so it is tested beside the loop
(tests/bert_flax/train/test_train_reuse.py)."""

from __future__ import annotations

import json

from bert_flax.runs import finished


def test_ended_run_is_only_a_run_that_ended_on_its_own(tmp_path):
    """A run that spent its steps or its clock is reused as it is (rerunning `make demo` must not
    give pre-training another budget); an interrupted one, or none, is trained (resumed)."""
    assert finished.ended_run(str(tmp_path)) is None
    final = {"step": 1291, "preempted": False, "eval": {"masked_lm_accuracy": 0.29}}
    (tmp_path / finished.FINAL_METRICS).write_text(json.dumps(final))
    assert finished.ended_run(str(tmp_path)) == final
    (tmp_path / finished.FINAL_METRICS).write_text(json.dumps({**final, "preempted": True}))
    assert finished.ended_run(str(tmp_path)) is None


def test_set_aside_takes_the_first_free_name_and_deletes_nothing(tmp_path):
    workdir = tmp_path / "run"
    (tmp_path / "run.stale-1").mkdir()
    for n in (2, 3):
        workdir.mkdir()
        (workdir / "kept").write_text(str(n))
        assert finished.set_aside(str(workdir)) == f"{workdir}.stale-{n}"
        assert (tmp_path / f"run.stale-{n}" / "kept").read_text() == str(n)
    assert not workdir.exists()
