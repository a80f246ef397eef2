"""A small reader for optimized HLO text: instructions, metadata, stack frames, FLOPs and bytes.

XLA prints the program it actually runs with `compiled.as_text()`. This module parses that text
(stable across backends) into `HloModule` / `HloComputation` / `HloInstruction`, resolves the
Python stack frames jax records for each op, enumerates the instructions the runtime executes
(entry computation plus while/conditional/call bodies, fusions as one op) and counts each executed
op's FLOPs and bytes from its shapes, the same way XLA's HloCostAnalysis does:

- `dot`: 2 x output elements x contracted elements; `convolution` likewise per kernel window;
- elementwise and reduce ops: one FLOP per element (transcendentals counted separately);
- bytes: operands read + outputs written at the op's boundary (for a fusion: its parameters and
  results, never its internal temporaries), with gathers/slices reading only what they take and
  in-place updates writing only the update. Only off-chip memory counts: an array whose layout
  places it in an on-chip memory space (TPU's `S(1)` VMEM, `S(2)`/`S(6)` scalar memories, where
  XLA's memory-space assignment prefetches operands) moves no HBM bytes, so a prefetch into VMEM
  is charged its HBM read alone and the op that reads the prefetched array nothing for it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Callable, Iterator

_DTYPE_BYTES = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2,
    "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
    "c64": 8, "c128": 16, "token": 0, "opaque": 0,
}  # fmt: skip

# Ops that cost nothing at run time (no kernel, no thunk): aliases, tuples and literals.
FREE_OPCODES = frozenset(
    {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
     "replica-id", "opt-barrier", "add-dependency", "domain"}
)  # fmt: skip
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
COLLECTIVE_OPCODES = frozenset(
    {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
     "collective-broadcast", "all-reduce-start", "all-reduce-done", "all-gather-start",
     "all-gather-done", "collective-permute-start", "collective-permute-done", "send", "recv",
     "send-done", "recv-done", "ragged-all-to-all"}
)  # fmt: skip
# Ops that read only part of their first operand / write only part of their result.
_PARTIAL_READ_OPCODES = frozenset({"gather", "dynamic-slice", "slice"})
_IN_PLACE_OPCODES = frozenset({"dynamic-update-slice", "scatter"})
# Asynchronous copies between memories (TPU): each reads and writes the array it moves.
_ASYNC_MOVES = frozenset({"copy-start", "slice-start"})
# Layout memory spaces `S(n)` off the chip: default device memory (HBM) and pinned host memory.
OFF_CHIP_MEMORY_SPACES = frozenset({0, 5})


@dataclasses.dataclass(frozen=True)
class Shape:
    """An array shape (`dtype`, `dims`) or a tuple of shapes (`dtype == "tuple"`)."""

    dtype: str
    dims: tuple[int, ...] = ()
    elements: tuple[Shape, ...] = ()
    memory_space: int = 0  # the layout's `S(n)`; 0 is device memory (HBM)

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def size(self) -> int:
        """Number of array elements (summed over tuple elements)."""
        if self.is_tuple:
            return sum(e.size for e in self.elements)
        return math.prod(self.dims)

    @property
    def bytes(self) -> float:
        if self.is_tuple:
            return sum(e.bytes for e in self.elements)
        return self.size * _DTYPE_BYTES.get(self.dtype, 4)

    @property
    def off_chip_bytes(self) -> float:
        """`bytes` of the arrays held off the chip (see `OFF_CHIP_MEMORY_SPACES`)."""
        return sum(a.bytes for a in self.arrays() if a.memory_space in OFF_CHIP_MEMORY_SPACES)

    def arrays(self) -> Iterator[Shape]:
        if self.is_tuple:
            for e in self.elements:
                yield from e.arrays()
        else:
            yield self

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(map(str, self.elements)) + ")"
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass(frozen=True)
class Frame:
    """One Python frame jax recorded for an op."""

    file: str
    function: str
    line: int


@dataclasses.dataclass
class HloInstruction:
    name: str
    opcode: str
    shape: Shape
    operands: list[str]
    attrs: str
    computation: str
    is_root: bool = False
    op_name: str = ""
    stack_frame_id: int = 0
    source: tuple[str, int] | None = None  # (file, line) from older metadata
    called: list[str] = dataclasses.field(default_factory=list)
    parameter_number: int = -1
    literal: str = ""  # a constant's value, as printed

    def attr(self, key: str) -> str | None:
        m = re.search(rf"(?:^|, ){re.escape(key)}=(\{{[^}}]*\}}|\"[^\"]*\"|[^,\s]+)", self.attrs)
        return m.group(1) if m else None

    def int_list_attr(self, key: str) -> tuple[int, ...]:
        value = self.attr(key)
        if not value:
            return ()
        return tuple(int(v) for v in re.findall(r"-?\d+", value))

    @property
    def custom_call_target(self) -> str:
        return (self.attr("custom_call_target") or "").strip('"')

    @property
    def known_trip_count(self) -> int | None:
        m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', self.attrs)
        return int(m.group(1)) if m else None


@dataclasses.dataclass
class HloComputation:
    name: str
    instructions: list[HloInstruction]
    is_entry: bool = False

    @functools.cached_property
    def by_name(self) -> dict[str, HloInstruction]:
        return {i.name: i for i in self.instructions}


@dataclasses.dataclass
class ExecutedOp:
    """An instruction the runtime executes as one unit, and how many times per program run."""

    instruction: HloInstruction
    count: int | None  # None: inside a loop of unknown trip count
    order: int


@dataclasses.dataclass
class HloModule:
    name: str
    computations: dict[str, HloComputation]
    entry: str
    frames: dict[int, tuple[Frame, int]]  # id -> (frame, parent id)
    instructions: dict[str, HloInstruction] = dataclasses.field(init=False)

    def __post_init__(self):
        self.instructions = {i.name: i for c in self.computations.values() for i in c.instructions}

    def stack(self, instruction: HloInstruction) -> list[Frame]:
        """The Python frames of an op, innermost first ([] when jax recorded none)."""
        frames, fid, seen = [], instruction.stack_frame_id, set()
        while fid and fid in self.frames and fid not in seen:
            seen.add(fid)
            frame, parent = self.frames[fid]
            frames.append(frame)
            fid = parent
        if not frames and instruction.source:
            frames.append(Frame(instruction.source[0], "", instruction.source[1]))
        return frames

    def fused_instructions(self, instruction: HloInstruction) -> list[HloInstruction]:
        """The ops inside a fusion (recursively through nested fusions); [op] for a plain op."""
        if instruction.opcode != "fusion":
            return [instruction]
        out = []
        for callee in instruction.called:
            for inner in self.computations[callee].instructions:
                out.extend(self.fused_instructions(inner))
        return out

    def trip_count(self, loop: HloInstruction) -> int | None:
        """Iterations of a `while`: XLA's `known_trip_count`, or (TPU programs print none) a
        counted loop's: its condition `counter < N` on a tuple element that starts at a
        constant (a `lax.scan` or `fori_loop`). None when neither says."""
        known = loop.known_trip_count
        if known is not None or len(loop.called) < 2:
            return known
        condition = self.computations.get((loop.attr("condition") or "").lstrip("%"))
        root = next((i for i in condition.instructions if i.is_root), None) if condition else None
        if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
            return None
        counter, bound = (self.instructions.get(o) for o in root.operands)
        if counter is None or bound is None or counter.opcode != "get-tuple-element":
            return None
        if bound.opcode != "constant" or not bound.literal.lstrip("-").isdigit():
            return None
        start = self._tuple_element(loop.operands[0], int(counter.attr("index") or 0))
        begin = int(start.literal) if start is not None and start.literal.isdigit() else 0
        return max(int(bound.literal) - begin, 0)

    def _tuple_element(self, tuple_name: str, index: int) -> HloInstruction | None:
        tuple_inst = self.instructions.get(tuple_name)
        if tuple_inst is None or tuple_inst.opcode != "tuple" or index >= len(tuple_inst.operands):
            return None
        element = self.instructions.get(tuple_inst.operands[index])
        while element is not None and element.opcode == "copy" and element.operands:
            element = self.instructions.get(element.operands[0])
        return element if element is not None and element.opcode == "constant" else None

    def executed_ops(
        self, branch_cost: Callable[[HloInstruction], tuple[float, float]] | None = None
    ) -> list[ExecutedOp]:
        """Every op the runtime runs, in program order, with its static execution count.

        A conditional's branches are all listed, of unknown count, unless `branch_cost` gives an
        op's (FLOPs, seconds): then only the branch that does the most arithmetic is, the
        quicker one of a tie, run as often as the conditional. A branch without arithmetic only
        moves data: a train step's "skip a non-finite update" branch, which keeps the old state
        (copying it), while a finite step takes the branch that applies the update."""
        out: list[ExecutedOp] = []

        def visit(computation: str, count: int | None):
            for inst in self.computations[computation].instructions:
                if inst.opcode in FREE_OPCODES:
                    continue
                out.append(ExecutedOp(inst, count, len(out)))
                if inst.opcode == "while":
                    trips = self.trip_count(inst)
                    inner = None if count is None or trips is None else count * trips
                    for callee in inst.called:
                        visit(callee, inner)
                elif inst.opcode == "conditional" and branch_cost is not None:
                    costs = {c: self._cost(c, branch_cost) for c in inst.called}
                    visit(max(costs, key=lambda c: (costs[c][0], -costs[c][1])), count)
                elif inst.opcode in ("conditional", "call", "async-start"):
                    for callee in inst.called:
                        visit(callee, None if inst.opcode == "conditional" else count)

        visit(self.entry, 1)
        return out

    def _cost(
        self, computation: str, op_cost: Callable[[HloInstruction], tuple[float, float]]
    ) -> tuple[float, float]:
        """`op_cost` summed over one run of `computation` (loops by their trip counts,
        conditionals by the branch `executed_ops` picks)."""
        flops = seconds = 0.0
        for inst in self.computations[computation].instructions:
            if inst.opcode in FREE_OPCODES:
                continue
            parts = [op_cost(inst)]
            if inst.opcode == "while":
                trips = self.trip_count(inst) or 1
                parts += [tuple(trips * x for x in self._cost(c, op_cost)) for c in inst.called]
            elif inst.opcode == "conditional":
                branches = [self._cost(c, op_cost) for c in inst.called]
                parts.append(max(branches, key=lambda fs: (fs[0], -fs[1])))
            elif inst.opcode in ("call", "async-start"):
                parts += [self._cost(c, op_cost) for c in inst.called]
            flops += sum(p[0] for p in parts)
            seconds += sum(p[1] for p in parts)
        return flops, seconds


# ----------------------------------------------------------------------------------------------
# Parsing


def _split_balanced(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket group that opens at text[start]."""
    depth = 0
    i = start
    in_str = False
    while i < len(text):
        ch = text[i]
        if ch == '"' and text[i - 1] != "\\":
            in_str = not in_str
        elif not in_str:
            if ch == open_ch:
                depth += 1
            elif ch == close_ch:
                depth -= 1
                if depth == 0:
                    return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_ch}{close_ch} in HLO text: {text[start : start + 80]!r}")


_ARRAY_SHAPE = re.compile(r"([a-z]+[0-9]*)\[([^\]]*)\](?:\{([^}]*)\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")


def parse_shape(text: str) -> Shape:
    text = text.strip()
    if text.startswith("("):
        inner = text[1:-1]
        elements, depth, start = [], 0, 0
        for i, ch in enumerate(inner):
            if ch in "({[":
                depth += 1
            elif ch in ")}]":
                depth -= 1
            elif ch == "," and depth == 0:
                elements.append(inner[start:i])
                start = i + 1
        elements.append(inner[start:])
        parts = [re.sub(r"/\*.*?\*/", "", e).strip() for e in elements]
        return Shape("tuple", elements=tuple(parse_shape(p) for p in parts if p))
    m = _ARRAY_SHAPE.match(text)
    if not m:
        return Shape(text.split("[")[0] or "opaque")
    dims = tuple(int(d.lstrip("<=")) for d in m.group(2).split(",") if d.strip())
    space = _MEMORY_SPACE.search(m.group(3) or "")
    return Shape(m.group(1), dims, memory_space=int(space.group(1)) if space else 0)


_INSTRUCTION_HEAD = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*")
_CALLED = re.compile(
    r"(?:calls|to_apply|body|condition|true_computation|false_computation|"
    r"branch_computations|called_computations)=(\{[^}]*\}|%?[\w.\-]+)"
)


def _parse_instruction(line: str, computation: str) -> HloInstruction | None:
    head = _INSTRUCTION_HEAD.match(line)
    if not head:
        return None
    pos = head.end()
    if line[pos] == "(":
        end = _split_balanced(line, pos, "(", ")")
        while end < len(line) and line[end] != " ":  # a tuple layout suffix
            end += 1
    else:
        end = line.index(" ", pos)
    shape = parse_shape(line[pos:end])
    rest = line[end:].lstrip()
    m = re.match(r"([\w\-]+)\(", rest)
    if not m:
        return None
    opcode = m.group(1)
    close = _split_balanced(rest, m.end() - 1, "(", ")")
    operand_text = rest[m.end() : close - 1]
    attrs = rest[close:].lstrip(", ")
    operands = re.findall(r"%([^\s,()]+)", operand_text)
    parameter_number = int(operand_text) if opcode == "parameter" else -1
    inst = HloInstruction(
        name=head.group(2),
        opcode=opcode,
        shape=shape,
        operands=operands,
        attrs=attrs,
        computation=computation,
        is_root=bool(head.group(1)),
        parameter_number=parameter_number,
        literal=operand_text.strip() if opcode == "constant" else "",
    )
    meta = re.search(r"(?<![\w_])metadata=\{(.*?)\}(?:, [\w_]+=|$)", attrs)  # not kernel_metadata
    if meta:
        body = meta.group(1)
        op = re.search(r'op_name="((?:[^"\\]|\\.)*)"', body)
        inst.op_name = op.group(1) if op else ""
        sf = re.search(r"stack_frame_id=(\d+)", body)
        inst.stack_frame_id = int(sf.group(1)) if sf else 0
        src = re.search(r'source_file="([^"]*)" source_line=(\d+)', body)
        inst.source = (src.group(1), int(src.group(2))) if src else None
    for group in _CALLED.findall(attrs):
        inst.called.extend(re.findall(r"%?([\w.\-]+)", group.strip("{}")))
    return inst


def _parse_frame_tables(text: str) -> dict[int, tuple[Frame, int]]:
    def table(title: str) -> dict[int, str]:
        m = re.search(rf"^{title}\n((?:\d+ .*\n)+)", text, re.M)
        if not m:
            return {}
        rows = (row.split(" ", 1) for row in m.group(1).splitlines())
        return {int(k): v for k, v in rows}

    files = {k: json.loads(v) for k, v in table("FileNames").items()}
    functions = {k: json.loads(v) for k, v in table("FunctionNames").items()}
    locations = {}
    for k, v in table("FileLocations").items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        locations[k] = Frame(
            files.get(int(f.get("file_name_id", 0)), ""),
            functions.get(int(f.get("function_name_id", 0)), ""),
            int(f.get("line", 0)),
        )
    frames = {}
    for k, v in table("StackFrames").items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        loc = locations.get(int(f.get("file_location_id", 0)))
        if loc is not None:
            parent = int(f.get("parent_frame_id", 0))
            frames[k] = (loc, 0 if parent == k else parent)
    return frames


# The line that closes a computation; TPU's SparseCore computations name their thread.
_COMPUTATION_END = re.compile(r'\}(, execution_thread="[^"]*")?\s*')


def _instruction_lines(text: str) -> list[str]:
    """The module's lines with each instruction on one: a Mosaic kernel's backend_config holds
    line breaks, and its continuation lines (one may start with "}}") belong to it."""
    lines: list[str] = []
    for line in text.splitlines():
        continues = lines and lines[-1].startswith("  ") and not _COMPUTATION_END.fullmatch(line)
        if continues and line and not line.startswith(" "):
            lines[-1] += "\n" + line
        else:
            lines.append(line)
    return lines


def parse_module(text: str) -> HloModule:
    """Parse the text of one optimized HLO module (`compiled.as_text()`)."""
    m = re.search(r"^HloModule ([^\s,]+)", text, re.M)
    if not m:
        raise ValueError("not HLO module text: expected a line starting with 'HloModule <name>'")
    computations: dict[str, HloComputation] = {}
    entry = None
    current: HloComputation | None = None
    for line in _instruction_lines(text):
        if current is None:
            header = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
            if header and not line.startswith(" "):
                current = HloComputation(header.group(2), [], bool(header.group(1)))
                if current.is_entry:
                    entry = current.name
            continue
        if line.startswith("}"):
            computations[current.name] = current
            current = None
            continue
        inst = _parse_instruction(line, current.name)
        if inst is not None:
            current.instructions.append(inst)
    if entry is None:
        raise ValueError(f"HLO module {m.group(1)} has no ENTRY computation")
    return HloModule(m.group(1), computations, entry, _parse_frame_tables(text))


# ----------------------------------------------------------------------------------------------
# Costs


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
