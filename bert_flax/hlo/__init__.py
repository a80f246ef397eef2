"""Compiled programs read from their HLO text: the executed ops (`parse`), the FLOPs and bytes of
each (`cost`, custom kernels counted from their shapes) and its operation class (`classify`).
Below both the ahead-of-time compile report (`bert_flax.aot`) and the step profiler
(`bert_flax.profile`).

    hlo_module = hlo.parse_module(jax.jit(f).lower(x).compile().as_text())
    for op in hlo_module.executed_ops():
        print(op.instruction.name, hlo.op_cost(hlo_module, op.instruction).flops)
"""

from bert_flax.hlo.cost import (
    FREE_CUSTOM_CALLS,
    OpCost,
    kernel_flops,
    op_cost,
    uncounted_kernels,
    xla_cost_analysis,
)
from bert_flax.hlo.parse import (
    COLLECTIVE_KINDS,
    COLLECTIVE_OPCODES,
    FREE_OPCODES,
    OFF_CHIP_MEMORY_SPACES,
    ExecutedOp,
    HloComputation,
    HloInstruction,
    HloModule,
    Shape,
    collective_kind,
    parse_module,
    parse_shape,
)

__all__ = [
    "COLLECTIVE_KINDS",
    "COLLECTIVE_OPCODES",
    "FREE_CUSTOM_CALLS",
    "FREE_OPCODES",
    "OFF_CHIP_MEMORY_SPACES",
    "ExecutedOp",
    "HloComputation",
    "HloInstruction",
    "HloModule",
    "OpCost",
    "Shape",
    "collective_kind",
    "kernel_flops",
    "op_cost",
    "parse_module",
    "parse_shape",
    "uncounted_kernels",
    "xla_cost_analysis",
]
