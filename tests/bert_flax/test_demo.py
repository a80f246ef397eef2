"""bert_flax.demo's pieces that the miniature of the demo (tests/journeys) does not single out."""

import json

from bert_flax import demo


def test_a_rerun_reuses_only_runs_that_ended_on_their_own(tmp_path):
    """A run that spent its steps or its clock is reused as it is (rerunning `make demo` must not
    give pre-training another budget); an interrupted one, or none, is trained (resumed)."""
    assert demo.ended_run(str(tmp_path)) is None
    final = {"step": 1291, "preempted": False, "eval": {"masked_lm_accuracy": 0.29}}
    (tmp_path / "final_metrics.json").write_text(json.dumps(final))
    assert demo.ended_run(str(tmp_path)) == final
    (tmp_path / "final_metrics.json").write_text(json.dumps({**final, "preempted": True}))
    assert demo.ended_run(str(tmp_path)) is None
