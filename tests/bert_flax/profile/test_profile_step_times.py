"""A traced step: class times add up to the step time, and the report says so."""

import json

import jax
import jax.numpy as jnp
import pytest

from bert_flax import profile
from bert_flax.profile import classify, report, trace


def test_class_times_add_up_to_the_step_time(toy_profile):
    p = toy_profile
    class_ms = sum(c.time_ms for c in p.classes)
    assert class_ms == pytest.approx(p.attributed_ms)
    assert class_ms + p.unattributed_ms == pytest.approx(p.step_ms)
    # Op events never cover more than the wall time they lie in. How much of the span from the
    # first op to the last they cover depends on how busy the machine is (descheduled runtime
    # threads leave gaps), so only a loose lower bound: the events were found and joined.
    assert p.span_ms <= p.step_ms * 1.001
    assert class_ms <= p.span_ms * 1.001
    assert class_ms >= 0.1 * p.span_ms
    assert p.runs == 3


def test_toy_step_has_the_classes_it_is_made_of(toy_profile):
    by_class = toy_profile.by_class()
    for name in (
        "attention_scores",
        "attention_context",
        "qkv_projection",
        "attention_output",
        "feed_forward",
        "normalization",
        "softmax",
        "dropout",
        "optimizer",
    ):
        assert name in by_class, name
        assert by_class[name].flops > 0, name
    scores, context = by_class["attention_scores"], by_class["attention_context"]
    assert scores.matmul_flops == context.matmul_flops  # B*h*L*L*d each, forward and backward


def test_op_times_come_from_trace_events(toy_profile):
    timed = [r for r in toy_profile.ops if r.time_ms > 0]
    assert len(timed) > 20
    assert all(r.op_class in profile.CLASSES for r in toy_profile.ops)


def test_json_lines_one_per_class_then_unattributed_and_total(toy_profile):
    lines = [json.loads(line) for line in report.json_lines(toy_profile)]
    assert [line["class"] for line in lines[-2:]] == ["unattributed", "total"]
    classes = lines[:-2]
    assert {c["class"] for c in classes} == {c.name for c in toy_profile.classes}
    assert sum(c["time_ms"] for c in lines[:-1]) == pytest.approx(lines[-1]["time_ms"])
    assert lines[-1]["gflop"] == pytest.approx(sum(c["gflop"] for c in classes))


def test_table_and_plots(toy_profile, tmp_path):
    table = report.format_table(toy_profile)
    assert "unattributed" in table and "step total" in table and "matmul: feed-forward" in table
    assert report.format_table(toy_profile, markdown=True).startswith("| class |")
    sweep = report.format_sweep([toy_profile, toy_profile])
    assert "all matmuls %" in sweep
    report.plot_stacked([toy_profile, toy_profile], str(tmp_path / "bar.png"))
    report.plot_roofline([toy_profile], str(tmp_path / "roof.png"))
    assert (tmp_path / "bar.png").stat().st_size > 10_000
    assert (tmp_path / "roof.png").stat().st_size > 10_000


def test_ceiling_fraction_is_the_roofline_bound():
    c = profile.Ceilings(100e9, 10e9, "float32", 1024, 2**26)
    compute = profile.ClassStats("feed_forward", 1.0, 50e6, 1e5, 1)  # 50 GFLOP/s, 0.1 GB/s
    memory = profile.ClassStats("softmax", 1.0, 1e5, 5e6, 1)  # 5 GB/s
    assert compute.ceiling_fraction(c) == pytest.approx(0.5)
    assert memory.ceiling_fraction(c) == pytest.approx(0.5)
    assert c.ridge_intensity == 10


def test_overlapping_ops_share_their_time():
    events = [
        trace.OpEvent("a", 0.0, 10.0, "r", (1, 1)),
        trace.OpEvent("b", 5.0, 10.0, "r", (1, 2)),
    ]
    t = trace.exclusive_times(events)
    assert t == {"a": 7.5, "b": 7.5}
    assert sum(t.values()) == 15.0  # the union of the intervals


def test_enclosing_events_are_dropped():
    outer = trace.OpEvent("while", 0.0, 10.0, "r", (1, 1))
    inner = trace.OpEvent("body_op", 1.0, 2.0, "r", (1, 1))
    assert trace._leaves([outer, inner]) == [inner]


def test_lone_matmul_step_is_mostly_matmul(tmp_path):
    a = jax.random.normal(jax.random.key(0), (512, 512))
    fake = profile.Ceilings(1e10, 1e9, "float32", 256, 2**26)
    p = profile.profile_step(
        jnp.matmul, a, a, steps=2, warmup=1, ceilings=fake, logdir=str(tmp_path)
    )
    # Of the time the ops themselves took (not the step's wall time, which a busy machine
    # stretches with gaps between ops), the matrix product takes most.
    op_ms = sum(c.time_ms for c in p.classes)
    matmul_ms = sum(c.time_ms for c in p.classes if c.name in classify.MATMUL_CLASSES)
    assert op_ms > 0 and matmul_ms / op_ms > 0.5, [(c.name, c.time_ms) for c in p.classes]
    assert p.total_flops == 2 * 512**3


def test_bad_steps_is_a_clear_error():
    with pytest.raises(ValueError, match="steps"):
        trace.trace_steps(lambda: None, "m", steps=0)
