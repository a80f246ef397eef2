"""A traced step: matmul FLOPs and times land in the classes the analytic model says, and the
report shows them."""

import dataclasses
import gzip
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

from bert_flax import hlo, profile
from bert_flax.hlo import classify
from bert_flax.profile import profiler, report, trace

B, L, H, HEADS = 4, 64, 64, 2  # conftest's ToyBlock: x is (4, 64, 64), 2 heads, FFN 4 * H


def analytic_matmul_flops() -> dict[str, int]:
    """2*M*N*K of every matrix product in ToyBlock's AdamW training step, by class.

    Forward: Q/K/V, output and two feed-forward Dense layers over B*L rows, and per head the
    (L x d) @ (d x L) scores and (L x L) @ (L x d) context products. Backward: the input x is
    not differentiated, so the Q/K/V projections (whose input is x) need only their kernel
    gradient (1 x forward); every other product needs both operands' gradients (2 x forward).
    """
    rows, d = B * L, H // HEADS
    dense = lambda n_in, n_out: 2 * rows * n_in * n_out
    attention = 2 * B * HEADS * L * L * d
    forward = {
        "qkv_projection": 3 * dense(H, H),
        "attention_scores": attention,
        "attention_context": attention,
        "attention_output": dense(H, H),
        "feed_forward": dense(H, 4 * H) + dense(4 * H, H),
    }
    return {name: (2 if name == "qkv_projection" else 3) * f for name, f in forward.items()}


def test_matmul_flops_per_class_equal_the_analytic_count(toy_profile):
    """Each matrix product lands in its class: the per-class FLOPs are the shapes' 2*M*N*K."""
    got = {c.name: c.matmul_flops for c in toy_profile.classes if c.matmul_flops}
    assert got == analytic_matmul_flops()
    assert toy_profile.by_class()["optimizer"].matmul_flops == 0  # AdamW has no products


def _replay(trace_file: str, module: str, op_us: dict[str, float], out: pathlib.Path) -> None:
    """The trace with each op event of `module` lasting `op_us[op]`, all one after another."""
    with gzip.open(trace_file, "rt") as f:
        data = json.load(f)
    clock = 0.0
    for e in data["traceEvents"] if isinstance(data, dict) else data:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args and args.get("hlo_module", module) == module:
            e["ts"], e["dur"] = clock, op_us.get(args["hlo_op"], 0.0)
            clock += e["dur"] + 1.0  # a gap: no overlaps, no op enclosing another
    with gzip.open(out, "wt") as f:
        json.dump(data, f)


def test_time_attribution_on_a_known_timeline(toy_train_step, toy_profile, tmp_path):
    """The toy step's real trace replayed as a device doing exactly 1 FLOP per picosecond of
    matrix products (everything else instantaneous): trace events -> ops -> classes -> per-step
    times must give every matmul class its analytic FLOPs / 1e9 ms, and the rest nothing."""
    fn, args, _ = toy_train_step
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    module = hlo.parse_module(fn.lower(*shapes).compile().as_text())
    assert module.name == toy_profile.module
    op_us = {  # per execution: an op run n times a step has n events per run
        e.instruction.name: hlo.op_cost(module, e.instruction).matmul_flops * 1e-6
        for e in module.executed_ops()
    }
    replayed = tmp_path / "replayed.trace.json.gz"
    _replay(toy_profile.trace_file, module.name, op_us, replayed)
    events, _ = trace.load_op_events(replayed, module.name)
    per_op, counts, span, runs = trace.per_step_times(events, toy_profile.runs)
    assert runs == toy_profile.runs == 3
    times = trace.TraceTimes(per_op, counts, span, span, runs, "replayed", str(replayed))
    records, classes = profiler.analyse(module, times)
    assert not [r.name for r in records if r.reason == "not in the HLO"]
    got = {c.name: c.time_ms for c in classes if c.time_ms}
    expected = {name: f / 1e9 for name, f in analytic_matmul_flops().items()}
    assert got == pytest.approx(expected, rel=1e-6)


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


def test_unattributed_time_splits_into_outside_the_span_and_gaps(toy_profile):
    p = toy_profile
    assert p.attributed_ms <= p.span_ms <= p.step_ms
    assert p.outside_span_ms == pytest.approx(p.step_ms - p.span_ms)
    assert p.gaps_ms == pytest.approx(p.span_ms - p.attributed_ms)
    assert p.outside_span_ms + p.gaps_ms == pytest.approx(p.unattributed_ms)
    unattributed = [json.loads(line) for line in report.json_lines(p)][-2]
    assert unattributed["outside_span_ms"] == pytest.approx(p.outside_span_ms)
    # Measured (untraced, back to back); its size against step_ms is a timing of a 2.5 ms step on
    # shared cores (5.6 against 2.5 ms seen in a clean-clone run), so not asserted here.
    assert p.pipelined_ms > 0


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


def test_zero_length_ops_take_no_time():
    events = [
        trace.OpEvent("a", 0.0, 10.0, "r", (1, 1)),
        trace.OpEvent("tiny", 4.0, 0.0, "r", (1, 2)),
        trace.OpEvent("b", 20.0, 5.0, "r", (1, 1)),
    ]
    assert trace.exclusive_times(events) == {"a": 10.0, "b": 5.0}


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


def test_memory_bound_share_is_the_non_matmul_time_below_the_ridge():
    ceilings = profile.Ceilings(
        flops_per_s=1e12, bytes_per_s=1e11, matmul_dtype="float32", matmul_size=1, stream_bytes=1
    )  # ridge: 10 FLOP per byte
    ops = [  # name, class, reason, ms, count, flops, bytes, transcendentals, matmul flops
        profile.OpRecord("mm", "feed_forward", "", 5.0, 1, 1e9, 1e6, 0, 1e9),
        profile.OpRecord("ln", "normalization", "", 2.0, 1, 1e6, 1e6, 0, 0),  # 1 FLOP/B
        profile.OpRecord("gelu", "activation", "", 1.0, 1, 5e7, 1e6, 0, 0),  # 50 FLOP/B
        profile.OpRecord("adam", "optimizer", "", 1.0, 1, 4e6, 1e6, 0, 0),  # 4 FLOP/B
    ]
    step = profile.StepProfile(
        label="", module="", step_ms=10.0, span_ms=9.0, pipelined_ms=9.5, attributed_ms=9.0,
        runs=1, timeline="", classes=[], ops=ops, ceilings=ceilings, xla_cost={}, trace_file="",
    )  # fmt: skip
    assert step.memory_bound_share() == pytest.approx(0.3)  # LayerNorm and Adam, not GELU
    assert dataclasses.replace(step, ceilings=None).memory_bound_share() is None
