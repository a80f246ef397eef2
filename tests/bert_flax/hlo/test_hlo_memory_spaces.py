# ruff: noqa: E501 (HLO lines as XLA prints them)
"""What the roofline charges for TPU memory spaces and conditionals, on hand-written HLO (the
shapes and layouts XLA's TPU compiler prints): only off-chip bytes count, and a conditional is
charged the branch a finite train step takes."""

from bert_flax import hlo
from bert_flax.aot import roofline, targets
from bert_flax.hlo import classify

# A prefetch of p0 into VMEM (S(1)), a fusion reading the prefetched copy and writing HBM, and a
# slice of p0 into VMEM followed by its ConcatBitcast (a free view of the slices side by side).
PREFETCH = """HloModule prefetch

%fused (param_0: f32[1024]) -> f32[1024] {
  %param_0 = f32[1024]{0:T(1024)S(1)} parameter(0)
  ROOT %negate.1 = f32[1024]{0:T(1024)} negate(%param_0)
}

ENTRY %main (p0: f32[1024]) -> (f32[1024], f32[1024]) {
  %p0 = f32[1024]{0:T(1024)} parameter(0)
  %copy-start = (f32[1024]{0:T(1024)S(1)}, f32[1024]{0:T(1024)}, u32[]{:S(2)}) copy-start(%p0)
  %copy-done = f32[1024]{0:T(1024)S(1)} copy-done(%copy-start)
  %fusion = f32[1024]{0:T(1024)} fusion(%copy-done), kind=kLoop, calls=%fused
  %slice-start = ((f32[1024]{0:T(1024)}), f32[512]{0:T(512)S(1)}, s32[]{:S(2)}) slice-start(%p0), slice={[0:512]}
  %slice-done = f32[512]{0:T(512)S(1)} slice-done(%slice-start)
  %custom-call = f32[512]{0:T(512)S(1)} custom-call(%slice-done), custom_call_target="ConcatBitcast"
  %copy = f32[1024]{0:T(1024)} copy(%p0)
  ROOT %tuple = (f32[1024]{0:T(1024)}, f32[1024]{0:T(1024)}) tuple(%fusion, %copy)
}
"""

# A finite step's conditional: branch `apply` updates the array, branch `keep` copies it.
CONDITIONAL = """HloModule conditional

%apply (p: f32[4096]) -> f32[4096] {
  %p = f32[4096]{0} parameter(0)
  ROOT %add = f32[4096]{0} add(%p, %p)
}

%keep (q: f32[4096]) -> f32[4096] {
  %q = f32[4096]{0} parameter(0)
  %one = s32[] constant(1)
  %streak = s32[] add(%one, %one)
  ROOT %copy = f32[4096]{0} copy(%q)
}

ENTRY %main (flag: pred[], x: f32[4096]) -> f32[4096] {
  %flag = pred[] parameter(0)
  %x = f32[4096]{0} parameter(1)
  ROOT %conditional = f32[4096]{0} conditional(%flag, %x, %x), true_computation=%apply, false_computation=%keep
}
"""


def costs(module):
    return {
        op.instruction.name: hlo.op_cost(module, op.instruction) for op in module.executed_ops()
    }


def test_layout_memory_space_is_parsed():
    assert hlo.parse_shape("f32[8,128]{1,0:T(8,128)S(1)}").memory_space == 1
    assert hlo.parse_shape("bf16[8]{0:T(8)(2,1)}").memory_space == 0
    pair = hlo.parse_shape("(f32[4]{0:S(1)}, f32[4]{0})")
    assert pair.bytes == 32 and pair.off_chip_bytes == 16


def test_on_chip_arrays_move_no_hbm_bytes():
    module = hlo.parse_module(PREFETCH)
    cost = costs(module)
    assert cost["copy-start"].bytes == 4096  # the prefetch reads HBM once, writes VMEM
    assert cost["fusion"].bytes == 4096  # reads the prefetched copy in VMEM: its write only
    assert cost["slice-start"].bytes == 2048
    assert cost["custom-call"].bytes == 0
    assert cost["copy"].bytes == 2 * 4096  # HBM to HBM: both ends


def test_prefetches_are_memory_moves_and_nothing_is_unnamed():
    module = hlo.parse_module(PREFETCH)
    classes = classify.Classifier(module).classify(module.executed_ops())
    named = {name: c.op_class for name, c in classes.items()}
    assert named["copy-start"] == named["slice-start"] == named["custom-call"] == "memory_moves"
    assert named["copy"] == "data_movement"
    assert not set(named.values()) & set(classify.UNNAMED_CLASSES)


def test_a_conditional_is_charged_the_branch_that_does_arithmetic():
    module = hlo.parse_module(CONDITIONAL)
    assert {op.instruction.name for op in module.executed_ops()} >= {"add", "copy"}
    chip = targets.target("v5e-8").chip
    classes = roofline.roofline_by_class(module, chip, vocab_size=30522)
    assert sum(c.flops for c in classes.values()) == 4096
    assert sum(c.bytes for c in classes.values()) == 2 * 4 * 4096  # the add's, not the copy's


# A counted loop as TPU programs print it (no known_trip_count): i from 0 while i < 12, each trip
# reading one [1, 256] layer of a stacked [12, 256] array through a nested fusion's slice.
LOOP = """HloModule loop

%slice_layer (input: f32[12,256], index: s32[]) -> f32[1,256] {
  %input = f32[12,256]{1,0} parameter(0)
  %index = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %dynamic-slice = f32[1,256]{1,0} dynamic-slice(%input, %index, %zero), dynamic_slice_sizes={1,256}
}

%layer (layers: f32[12,256], li: s32[]) -> f32[1,256] {
  %layers = f32[12,256]{1,0} parameter(0)
  %li = s32[] parameter(1)
  %slice = f32[1,256]{1,0} fusion(%layers, %li), kind=kLoop, calls=%slice_layer
  ROOT %negate = f32[1,256]{1,0} negate(%slice)
}

%body (state: (s32[], f32[12,256], f32[1,256])) -> (s32[], f32[12,256], f32[1,256]) {
  %state = (s32[], f32[12,256]{1,0}, f32[1,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %stacked = f32[12,256]{1,0} get-tuple-element(%state), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %out = f32[1,256]{1,0} fusion(%stacked, %i), kind=kLoop, calls=%layer
  ROOT %tuple = (s32[], f32[12,256]{1,0}, f32[1,256]{1,0}) tuple(%next, %stacked, %out)
}

%condition (cstate: (s32[], f32[12,256], f32[1,256])) -> pred[] {
  %cstate = (s32[], f32[12,256]{1,0}, f32[1,256]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%cstate), index=0
  %trips = s32[] constant(12)
  ROOT %lt = pred[] compare(%ci, %trips), direction=LT
}

ENTRY %main (p0: f32[12,256], p1: f32[1,256]) -> (s32[], f32[12,256], f32[1,256]) {
  %p0 = f32[12,256]{1,0} parameter(0)
  %p1 = f32[1,256]{1,0} parameter(1)
  %start = s32[] constant(0)
  %init = (s32[], f32[12,256]{1,0}, f32[1,256]{1,0}) tuple(%start, %p0, %p1)
  ROOT %while = (s32[], f32[12,256]{1,0}, f32[1,256]{1,0}) while(%init), condition=%condition, body=%body
}
"""


def test_a_counted_loop_runs_its_trips_and_a_layer_read_is_its_slice():
    module = hlo.parse_module(LOOP)
    assert module.trip_count(module.instructions["while"]) == 12
    counts = {op.instruction.name: op.count for op in module.executed_ops()}
    assert counts["out"] == 12
    assert hlo.op_cost(module, module.instructions["out"]).bytes == 4 * 256 + 4 + 4 * 256
