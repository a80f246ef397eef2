"""FLOPs and bytes of each executed op of an `HloModule` (`parse`), as XLA's HloCostAnalysis
counts them, and of the custom kernels XLA cannot see into, from their operands' shapes."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from bert_flax.hlo.parse import OFF_CHIP_MEMORY_SPACES, HloComputation, HloInstruction, HloModule

TRANSCENDENTAL_OPCODES = frozenset(
    {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "rsqrt", "sqrt",
     "cbrt", "power", "logistic", "erf", "sine", "cosine", "tan", "atan2"}
)  # fmt: skip
ELEMENTWISE_OPCODES = frozenset(
    {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "compare",
     "select", "clamp", "and", "or", "xor", "not", "shift-left", "shift-right-logical",
     "shift-right-arithmetic", "remainder", "sign", "floor", "ceil", "round-nearest-afz",
     "round-nearest-even", "convert", "is-finite", "popcnt", "count-leading-zeros", "real",
     "imag", "stochastic-convert"}
)  # fmt: skip
# Ops that read only part of their first operand / write only part of their result.
_PARTIAL_READ_OPCODES = frozenset({"gather", "dynamic-slice", "slice"})
_IN_PLACE_OPCODES = frozenset({"dynamic-update-slice", "scatter"})
# Asynchronous copies between memories (TPU): each reads and writes the array it moves.
_ASYNC_MOVES = frozenset({"copy-start", "slice-start"})


@dataclasses.dataclass
class OpCost:
    flops: float = 0.0  # all FLOPs, matrix products and the elementwise work fused with them
    transcendentals: float = 0.0
    bytes: float = 0.0
    matmul_flops: float = 0.0  # the dot/convolution part of `flops`


def _instruction_flops(
    module: HloModule, inst: HloInstruction, visited: float = 1.0
) -> tuple[float, float]:
    """(flops, transcendentals) of one non-fusion instruction (`visited`: see `kernel_flops`)."""
    op = inst.opcode
    out = inst.shape.size
    if op == "dot":
        lhs = module.instructions[inst.operands[0]].shape
        contracted = math.prod(lhs.dims[d] for d in inst.int_list_attr("lhs_contracting_dims"))
        return 2.0 * out * contracted, 0.0
    if op == "convolution":
        rhs = module.instructions[inst.operands[1]].shape
        labels = inst.attr("dim_labels") or ""
        kernel = labels.split("_")[1].split("->")[0] if "_" in labels else ""
        out_features = rhs.dims[kernel.index("o")] if "o" in kernel else 1
        return 2.0 * out * rhs.size / max(out_features, 1) * _window_taps(module, inst), 0.0
    if op in TRANSCENDENTAL_OPCODES:
        return 0.0, float(out)
    if op in ELEMENTWISE_OPCODES:
        return float(out), 0.0
    if op in ("reduce", "reduce-window", "all-reduce", "reduce-scatter"):
        inputs = [module.instructions[o].shape for o in inst.operands]
        n_in = len(inputs) // 2 if op in ("reduce", "reduce-window") else len(inputs)
        return float(sum(s.size for s in inputs[: max(n_in, 1)])), 0.0
    if op == "scatter":
        updates = module.instructions[inst.operands[-1]].shape
        return float(updates.size), 0.0
    if op == "custom-call":
        return kernel_flops(module, inst, visited) or (0.0, 0.0)
    return 0.0, 0.0


# -- Custom kernels: what XLA cannot see into, counted from their operands' shapes -------------

# Matrix products per (query, key) pair and head dimension in each splash attention kernel
# (jax.experimental.pallas.ops.tpu.splash_attention), every block computed (segment ids mask
# inside blocks, nothing is skipped): the forward QK^T and PV; the dK/dV kernel recomputes
# QK^T and takes dO V^T, P^T dO and dS^T Q; the dQ kernel recomputes QK^T and takes dO V^T and
# dS K. Each product is 2 FLOPs per multiply-add; each kernel exponentiates every logit once.
_SPLASH_PRODUCTS = {"splash_mha_fwd": 2, "splash_mha_dkv": 4, "splash_mha_dq": 3}
# jax.experimental.pallas.ops.gpu.attention's Triton kernels, q and k [rows, length, heads,
# head_dim]: the backward kernel recomputes the scores for its dK/dV and its dQ loop (7
# products); the preprocess kernel only sums out x dout (first: its name ends as the other's).
_PALLAS_GPU_PRODUCTS = {"mha_preprocess_backward": 0, "mha_forward": 2, "mha_backward": 7}
# `bert_flax.kernels`' block-skipping attention (packed_tpu and packed_gpu give their kernels the
# same names): splash's products, in the blocks the kernel visits alone. The forward QK^T and PV;
# dQ recomputes QK^T and takes dO V^T and dS K; dK/dV recomputes QK^T and takes P^T dO, dO V^T and
# dS^T Q.
_PACKED_PRODUCTS = {"packed_attention_fwd": 2, "packed_attention_dq": 3, "packed_attention_dkv": 4}
# Every flash kernel's bytes are its operands and results once: the key/value blocks that its
# programs (one a query block) loop over again are served from cache (the VMEM copy of a row on TPU;
# L2 on GPU: a row's K and V at 8,192 tokens are 2 MiB a head), as for pallas_gpu and splash.
_FLOAT_DTYPES = frozenset({"f32", "bf16", "f16", "f8e4m3fn", "f8e5m2"})
# The names `bert_flax.kernels.block_sparse_gpu` and `block_sparse_tpu` give their kernels.
_BLOCK_SPARSE_KERNELS = ("block_sparse_product", "block_sparse_weight_grad")
# cuBLAS's matrix products, as XLA's GPU gemm rewriter writes them where it does not emit a Triton
# fusion (`xla_gpu_enable_triton_gemm=false`, or its autotuner's pick on a device): the dot's
# dimension numbers are in the backend config; the result is (product, workspace).
_CUBLAS_TARGETS = re.compile(r"^__cublas\$(gemm|lt\$matmul)")
# cuDNN's fused LayerNorm, forward or backward (`sharding.COMPILER_OPTIONS` on GPU).
_CUDNN_NORM = "__cudnn$norm"
# Custom calls that compute and move nothing (bookkeeping XLA inserts on TPU: views of adjacent
# slices, an uninitialised buffer, index annotations).
FREE_CUSTOM_CALLS = frozenset(
    {"ConcatBitcast", "AllocateBuffer", "AssumeGatherIndicesInBound",
     "GatherScatterIndicesBitpacked", "Sharding",
     "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost", "MoveToDevice"}
)  # fmt: skip


def _packed_attention_kernel(inst: HloInstruction) -> str | None:
    """Which of the block-skipping attention kernels `inst` is (None: none)."""
    return next((n for n in _PACKED_PRODUCTS if n in inst.op_name or inst.name.startswith(n)), None)


def kernel_flops(
    module: HloModule, inst: HloInstruction, visited: float = 1.0
) -> tuple[float, float] | None:
    """(FLOPs, transcendentals) of a known custom kernel (splash attention, Pallas GPU attention,
    the block-skipping attention, cuBLAS's products, cuDNN's LayerNorm, the block-sparse matmul)
    from its operands' shapes; None for a custom call it does not know. The block-skipping
    kernels are charged `visited` of dense attention's (the share of block pairs they visit for
    the rows they are given)."""
    operands = [module.instructions[o].shape for o in inst.operands]
    packed = _packed_attention_kernel(inst)
    if packed is not None:
        # Operands [rows, heads, length, head_dim] on TPU, [rows, length, heads, head_dim] on GPU
        # (some TPU ones split the length into blocks: 5 dimensions).
        q = next(s for s in operands if len(s.dims) == 4 and s.dtype in _FLOAT_DTYPES)
        if inst.custom_call_target == "tpu_custom_call":
            rows, heads, length, head_dim = q.dims
        else:
            rows, length, heads, head_dim = q.dims
        pairs = visited * rows * heads * length**2
        return 2.0 * _PACKED_PRODUCTS[packed] * pairs * head_dim, pairs
    for name, products in _SPLASH_PRODUCTS.items():
        if name in inst.op_name or inst.name.startswith(name):
            # q, k: [rows, heads, length, head_dim] (rows absent outside a vmap).
            q, k = [s for s in operands if len(s.dims) >= 3 and s.dtype in _FLOAT_DTYPES][:2]
            *lead, q_len, head_dim = q.dims
            pairs = math.prod(lead) * q_len * k.dims[-2]
            return 2.0 * products * pairs * head_dim, float(pairs)
    for name, products in _PALLAS_GPU_PRODUCTS.items():
        if name in inst.op_name:
            q, k = [s for s in operands if len(s.dims) == 4 and s.dtype in _FLOAT_DTYPES][:2]
            rows, q_len, heads, head_dim = q.dims
            pairs = rows * heads * q_len * k.dims[1]
            return 2.0 * products * pairs * head_dim, float(pairs if products else 0)
    if _CUBLAS_TARGETS.match(inst.custom_call_target):
        contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', inst.attrs)
        dims = [int(d) for d in re.findall(r"\d+", contracting.group(1))] if contracting else []
        product = next(inst.shape.arrays())
        return 2.0 * product.size * math.prod(operands[0].dims[d] for d in dims), 0.0
    if inst.custom_call_target == _CUDNN_NORM:  # memory-bound: one FLOP an element it moves
        return float(sum(s.size for s in operands) + inst.shape.size), 0.0
    if any(name in inst.op_name or inst.name.startswith(name) for name in _BLOCK_SPARSE_KERNELS):
        # Every stored block [nnz, b, b] (an operand, or the weight gradient's result) meets
        # every row of the activations [rows, features] once.
        arrays = [s for s in (*operands, *inst.shape.arrays()) if s.dtype in _FLOAT_DTYPES]
        blocks = next(s for s in arrays if len(s.dims) == 3)
        rows = next(s.dims[0] for s in arrays if len(s.dims) == 2)
        return 2.0 * rows * blocks.size, 0.0
    return None


def _window_taps(module: HloModule, inst: HloInstruction) -> float:
    """The share of a convolution's (output position, kernel tap) pairs that read a real input
    element, not padding or a hole of `lhs_dilate`. TPU programs write batched matrix products
    as convolutions whose dilated windows mostly hit holes (`size=2x12 lhs_dilate=2x12`)."""
    window = (inst.attr("window") or "").strip("{}")
    fields = dict(f.split("=", 1) for f in window.split() if "=" in f)
    if "size" not in fields:
        return 1.0
    sizes = [int(k) for k in fields["size"].split("x")]
    ones = ["1"] * len(sizes)

    def per_dim(key: str, default: list[str]) -> list[str]:
        return fields[key].split("x") if key in fields else default

    strides, lhs_dilation = per_dim("stride", ones), per_dim("lhs_dilate", ones)
    rhs_dilation = per_dim("rhs_dilate", ones)
    pads = per_dim("pad", ["0_0"] * len(sizes))
    lhs_labels, rest = (inst.attr("dim_labels") or "_->").split("_", 1)
    out_labels = rest.split("->")[1]
    lhs = module.instructions[inst.operands[0]].shape
    share = 1.0
    for d, size in enumerate(sizes):
        length = lhs.dims[lhs_labels.index(str(d))]
        outputs = inst.shape.dims[out_labels.index(str(d))]
        stride, dilate, rhs_dilate = int(strides[d]), int(lhs_dilation[d]), int(rhs_dilation[d])
        low = int(pads[d].split("_")[0])
        positions = (o * stride + t * rhs_dilate - low for o in range(outputs) for t in range(size))
        real = sum(1 for p in positions if p >= 0 and p % dilate == 0 and p // dilate < length)
        share *= real / (outputs * size)
    return share


def _operand_read_bytes(module: HloModule, inst: HloInstruction, index: int) -> float:
    """Off-chip bytes an op reads from operand `index`, accounting for partial reads."""
    operand = module.instructions[inst.operands[index]]
    full = operand.shape.off_chip_bytes
    if not full:
        return 0.0
    if inst.opcode in _PARTIAL_READ_OPCODES and index == 0:
        return min(inst.shape.bytes, full)
    if inst.opcode in _IN_PLACE_OPCODES and index == 0:
        return 0.0
    if inst.opcode == "fusion":
        return _fusion_parameter_read_bytes(module, inst, index, full)
    return full


def _fusion_parameter_read_bytes(
    module: HloModule, fusion: HloInstruction, index: int, full: float
) -> float:
    """Bytes a fusion reads of its operand `index`: what its slices take where it only slices
    it (through bitcasts and nested fusions: a loop body's fusion that takes one layer of a
    stacked array), else all of it."""
    computation = module.computations[fusion.called[0]]
    param = next(
        (
            i
            for i in computation.instructions
            if i.opcode == "parameter" and i.parameter_number == index
        ),
        None,
    )
    if param is None:
        return full
    return min(_value_read_bytes(module, computation, param, full), full)


def _value_read_bytes(
    module: HloModule,
    computation: HloComputation,
    value: HloInstruction,
    full: float,
    depth: int = 0,
) -> float:
    users = [i for i in computation.instructions if value.name in i.operands]
    total = 0.0
    for user in users:
        position = user.operands.index(value.name)
        if user.opcode in _PARTIAL_READ_OPCODES and position == 0:
            total += user.shape.bytes
        elif user.opcode in _IN_PLACE_OPCODES and position == 0:
            total += 0.0
        elif user.opcode == "bitcast" and depth < 8:
            total += _value_read_bytes(module, computation, user, full, depth + 1)
        elif user.opcode == "fusion" and depth < 8:  # a nested fusion: how it reads its operand
            total += _fusion_parameter_read_bytes(module, user, position, full)
        else:
            return full
        if total >= full:
            return full
    return total


def _written_bytes(module: HloModule, inst: HloInstruction) -> float:
    """Off-chip bytes an op writes (in-place updates: the update only)."""
    if inst.opcode in _IN_PLACE_OPCODES:
        if inst.shape.memory_space not in OFF_CHIP_MEMORY_SPACES:
            return 0.0
        update = module.instructions[inst.operands[-1 if inst.opcode == "scatter" else 1]]
        return update.shape.bytes
    if inst.opcode == "fusion":
        root = next(i for i in module.computations[inst.called[0]].instructions if i.is_root)
        if root.opcode != "tuple":
            pairs = [(root, inst.shape)]
        else:  # the fusion's own results carry the memory spaces, its inner roots the shapes
            pairs = zip((module.instructions[o] for o in root.operands), inst.shape.elements)
        total = 0.0
        for r, out in pairs:
            if out.memory_space in OFF_CHIP_MEMORY_SPACES:
                in_place = r.opcode in _IN_PLACE_OPCODES
                total += _written_bytes(module, r) if in_place else r.shape.bytes
        return total
    return inst.shape.off_chip_bytes


def _async_move_bytes(module: HloModule, inst: HloInstruction) -> float:
    """Off-chip bytes of a `copy-start`/`slice-start` ((destination, source, context) for a
    copy; ((source), destination, context) for a slice): the array moved, once for each of its
    two ends off the chip (a prefetch from HBM into VMEM reads HBM once)."""
    source = module.instructions[inst.operands[0]].shape
    arrays = [a for a in inst.shape.arrays() if a.dims]
    moved = min((a.bytes for a in arrays), default=0.0)
    destination = arrays[1] if inst.opcode == "slice-start" and len(arrays) > 1 else arrays[0]
    ends = [source.memory_space, destination.memory_space] if arrays else []
    return moved * sum(space in OFF_CHIP_MEMORY_SPACES for space in ends)


def op_cost(module: HloModule, inst: HloInstruction, visited: float = 1.0) -> OpCost:
    """FLOPs, transcendentals and bytes of one executed op (a fusion counted as one op);
    `visited`: the share of block pairs the block-skipping attention visits (`kernel_flops`)."""
    cost = OpCost()
    for inner in module.fused_instructions(inst):
        flops, trans = _instruction_flops(module, inner, visited)
        cost.flops += flops
        cost.transcendentals += trans
        if inner.opcode in ("dot", "convolution") or (inner.opcode == "custom-call" and flops):
            cost.matmul_flops += flops
    if inst.opcode in ("while", "conditional", "call") or inst.opcode.endswith("-done"):
        return OpCost()  # bodies are counted as separate executed ops; async pairs at -start
    if inst.opcode == "custom-call" and inst.custom_call_target in FREE_CUSTOM_CALLS:
        return OpCost()
    if inst.opcode in _ASYNC_MOVES:
        return dataclasses.replace(cost, bytes=_async_move_bytes(module, inst))
    seen = set()
    for index, name in enumerate(inst.operands):
        if name in seen:
            continue
        seen.add(name)
        cost.bytes += _operand_read_bytes(module, inst, index)
    cost.bytes += _written_bytes(module, inst)
    return cost


def uncounted_kernels(module: HloModule) -> list[str]:
    """The executed custom calls that compute something the roofline cannot count."""
    return sorted(
        {
            inst.custom_call_target
            for op in module.executed_ops()
            for inst in module.fused_instructions(op.instruction)
            if inst.opcode == "custom-call"
            and inst.custom_call_target not in FREE_CUSTOM_CALLS
            and kernel_flops(module, inst) is None
        }
    )


def xla_cost_analysis(compiled: Any) -> dict[str, float]:
    """XLA's own totals for a compiled program: "flops", "transcendentals" and "bytes accessed"
    where it gives them (none on CUDA, nor on backends without a cost analysis)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # some backends do not implement it
        return {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    keys = ("flops", "transcendentals", "bytes accessed")
    return {k: float(cost[k]) for k in keys if cost and k in cost}
