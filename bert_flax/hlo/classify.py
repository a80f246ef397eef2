"""Operation classes of a BERT training step, and the rules that put each executed HLO op in one.

An executed op is usually a fusion of many HLO instructions, so it is classified by what it holds:

1. a matrix product (a `dot`/`convolution`, or a GEMM/attention custom call) makes the op a
   matmul; which matmul comes from the flax module path in the dot's `op_name` metadata
   (`.../attention/query/dot_general`), its shapes (batched dots are the attention products, a
   vocabulary-sized dimension is the MLM head) and, for attention, program order: the first
   forward attention product at a source line is the score product QK^T, the other the context
   product PV, and their backward products follow their source line;
2. collectives by opcode; the loss by the Python frames jax records (a file named `*loss*`);
   ops outside autodiff (no `jvp(`/`transpose(` in their op_name) in a differentiated program
   are the optimizer update: its matrix products (Shampoo's statistics and preconditioning) a
   matmul class of their own, the rest the optimizer's elementwise update;
3. otherwise each instruction inside votes by its own evidence (module path and frames such as
   `LayerNorm`/`Dropout`, or its opcode: `rsqrt` normalisation, `exp`/max-reduce softmax,
   `tanh`/`erf` activation, random bits dropout, gather/scatter on a table embedding), weighted
   by the elements it produces; the largest vote wins;
4. with no votes, an add of two full-size tensors is a residual add, other arithmetic inside a
   Dense layer's scope is its bias add (or, backward, the bias gradient's reduction); of pure
   data movement, asynchronous copies and slices with an end in on-chip memory (TPU's
   memory-space assignment prefetching into VMEM and evicting out of it) are `memory_moves`,
   ops that only convert dtypes `casts`, concatenates and pads `concat_pad`, the other
   copies/transposes/broadcasts/slices `data_movement`; anything left is `other`, the one
   class the report calls unnamed;
5. an op XLA created without metadata takes the class of the op that feeds it.
"""

from __future__ import annotations

import dataclasses
import re

from bert_flax import hlo

MATMUL_CLASSES = (
    "attention_scores",
    "attention_context",
    "attention_fused",
    "qkv_projection",
    "attention_output",
    "feed_forward",
    "mlm_head",
    "matmul_other",
    "optimizer_matmul",
)
# Everything else. Not all of it is memory-bound: `StepProfile.memory_bound_share` asks the
# roofline which ops are.
NON_MATMUL_CLASSES = (
    "normalization",
    "softmax",
    "activation",
    "dropout",
    "residual",
    "bias",
    "embedding",
    "loss",
    "optimizer",
    "memory_moves",
    "casts",
    "concat_pad",
    "data_movement",
    "collectives",
    "other",
)
# The classes that say what an op does by no more than its opcodes.
UNNAMED_CLASSES = ("other",)
CLASSES = MATMUL_CLASSES + NON_MATMUL_CLASSES

LABELS = {
    "attention_scores": "matmul: attention scores QK^T",
    "attention_context": "matmul: attention context PV",
    "attention_fused": "matmul: fused attention kernel",
    "qkv_projection": "matmul: Q/K/V projections",
    "attention_output": "matmul: attention output proj.",
    "feed_forward": "matmul: feed-forward",
    "mlm_head": "matmul: MLM head",
    "matmul_other": "matmul: other (pooler, NSP)",
    "optimizer_matmul": "matmul: optimizer (Shampoo)",
    "normalization": "normalisation (LayerNorm)",
    "softmax": "softmax",
    "activation": "activation (GELU)",
    "dropout": "dropout and random bits",
    "residual": "residual adds",
    "bias": "bias adds and gradients",
    "embedding": "embedding gather/scatter",
    "loss": "loss",
    "optimizer": "optimizer update (elementwise)",
    "memory_moves": "prefetch/evict HBM <-> on-chip memory",
    "casts": "dtype casts (float32 <-> bfloat16)",
    "concat_pad": "concatenates and pads",
    "data_movement": "data movement (copy/transpose)",
    "collectives": "collectives",
    "other": "other elementwise",
    "unattributed": "unattributed (gaps, dispatch)",
}

_MOVEMENT_OPCODES = frozenset(
    {"copy", "transpose", "broadcast", "reshape", "bitcast", "slice", "concatenate", "pad",
     "dynamic-slice", "dynamic-update-slice", "iota", "reverse", "convert", "copy-start",
     "copy-done", "gather", "scatter", "bitcast-convert", "get-tuple-element", "tuple",
     "parameter", "constant"}
)  # fmt: skip
_ASYNC_MOVE_OPCODES = frozenset({"copy-start", "copy-done", "slice-start", "slice-done"})
_TABLE_OPCODES = frozenset({"gather", "scatter", "dynamic-slice", "dynamic-update-slice"})
_RNG_OPCODES = frozenset({"rng", "rng-bit-generator", "rng-get-and-update-state"})
_GEMM_TARGETS = re.compile(r"gemm|matmul|cublas|onednn\$matmul|ynn", re.I)
_ATTENTION_TARGETS = re.compile(r"fmha|flash|attention|splash|sdpa", re.I)
_WRAPPER = re.compile(r"^[\w.]*\(.*\)$")  # jit(f), jvp(Model), transpose(jvp(...)), ...
_SCOPE_WORDS = frozenset({"while", "body", "cond", "closed_call", "checkpoint", "remat", "scan"})

_QKV = {"query", "key", "value", "qkv", "q_proj", "k_proj", "v_proj", "query_key_value", "wq",
        "wk", "wv", "q", "k", "v"}  # fmt: skip
_ATTENTION_OUT = {"output", "out", "dense", "o_proj", "out_proj", "o", "wo_attn"}
_FFN = {"intermediate", "mlp", "ffn", "feed_forward", "feedforward", "wi", "wo", "fc1", "fc2",
        "output", "ffn_in", "ffn_out"}  # fmt: skip
_MLM = {"cls", "predictions", "mlm", "mlm_head", "lm_head", "transform", "decoder"}
_ATTENTION_SCOPES = {"attention", "attn", "self_attention", "self", "mha", "multi_head_attention"}


@dataclasses.dataclass(frozen=True)
class OpClass:
    op_class: str
    reason: str


def op_name_parts(op_name: str) -> tuple[list[str], str]:
    """(module path tokens, primitive) of an op_name like `jit(f)/jvp(M)/enc/query/dot_general`."""
    components = op_name.split(";")[0].split("/")
    primitive = components[-1] if components else ""
    tokens = [
        c
        for c in components[:-1]
        if c and not _WRAPPER.match(c) and c not in _SCOPE_WORDS and "->" not in c
    ]
    return tokens, primitive


def _lower_tokens(inst: hlo.HloInstruction) -> list[str]:
    return [t.lower() for t in op_name_parts(inst.op_name)[0]]


def in_autodiff(op_name: str) -> bool:
    return "jvp(" in op_name or "transpose(" in op_name


def _frames_text(module: hlo.HloModule, inst: hlo.HloInstruction, depth: int = 4) -> str:
    return " ".join(f"{f.file}:{f.function}" for f in module.stack(inst)[:depth]).lower()


def _is_loss(module: hlo.HloModule, inst: hlo.HloInstruction) -> bool:
    """Any frame in a file named *loss* or directly in a *loss* folder (optax/losses/...)."""
    tails = ["/".join(f.file.lower().rsplit("/", 2)[-2:]) for f in module.stack(inst)]
    return any("loss" in t for t in tails)


def _reduce_kind(module: hlo.HloModule, inst: hlo.HloInstruction) -> str:
    if not inst.called:
        return ""
    computation = module.computations.get(inst.called[0])
    if computation is None:
        return ""
    root = next((i for i in computation.instructions if i.is_root), None)
    return root.opcode if root is not None else ""


def _is_table(module: hlo.HloModule, inst: hlo.HloInstruction) -> bool:
    """A gather/scatter/dynamic-slice whose source (or destination) is a 2-D table."""
    if not inst.operands:
        return False
    table = module.instructions.get(inst.operands[0])
    return table is not None and len(table.shape.dims) == 2 and table.shape.dims[0] >= 64


def _hint(module: hlo.HloModule, inst: hlo.HloInstruction) -> str | None:
    """What one (non-matmul) instruction is evidence of, from its metadata or opcode."""
    op = inst.opcode
    tokens = " ".join(_lower_tokens(inst))
    text = inst.op_name.lower() + " " + _frames_text(module, inst)
    if op in hlo.COLLECTIVE_OPCODES:
        return "collectives"
    if op in _RNG_OPCODES or re.search(r"threefry|random_bits|bernoulli|dropout|_uniform", text):
        return "dropout"
    if re.search(r"layer_?norm|rms_?norm|_normalize|_compute_stats|\bln\b|norm_?\d*\b", tokens):
        return "normalization"
    functions = " ".join(f.function for f in module.stack(inst)[:2]).lower()
    if re.search(r"layer_?norm|rms_?norm|_normalize|_compute_stats", functions):
        return "normalization"
    if "softmax" in text:
        return "softmax"
    if re.search(r"gelu|relu|silu|swish|:activation\b", text) or op in ("tanh", "erf", "logistic"):
        return "activation"
    path = set(_lower_tokens(inst))
    if (
        path & _ATTENTION_SCOPES
        and not path & (_QKV | _ATTENTION_OUT)
        and op not in _MOVEMENT_OPCODES
    ):
        return "softmax"  # scale, mask, softmax and its normalisers inside the attention block
    if op == "exponential" or (op == "reduce" and _reduce_kind(module, inst) == "maximum"):
        return "softmax"
    if op == "rsqrt":
        return "normalization"
    if op in _TABLE_OPCODES and ("embed" in tokens or _is_table(module, inst)):
        return "embedding"
    if "embed" in tokens:
        return "embedding"
    return None


def _is_residual_add(module: hlo.HloModule, inst: hlo.HloInstruction) -> bool:
    if inst.opcode != "add" or len(inst.operands) != 2 or len(inst.shape.dims) < 2:
        return False
    for name in inst.operands:
        operand = module.instructions.get(name)
        if operand is None or operand.opcode in ("broadcast", "constant"):
            return False
        if operand.shape.dims != inst.shape.dims:
            return False
    return True


def _matmul_instruction(
    module: hlo.HloModule, inner: list[hlo.HloInstruction]
) -> hlo.HloInstruction | None:
    for inst in inner:
        if inst.opcode in ("dot", "convolution"):
            return inst
        if inst.opcode == "custom-call" and (
            _GEMM_TARGETS.search(inst.custom_call_target)
            or _ATTENTION_TARGETS.search(inst.custom_call_target + " " + inst.op_name)
            or hlo.kernel_flops(module, inst)  # a Pallas kernel of matrix products
        ):
            return inst
    return None


class Classifier:
    """Classifies the executed ops of one module; see the module docstring for the rules."""

    def __init__(self, module: hlo.HloModule, *, vocab_size: int | None = None):
        self.module = module
        self.vocab_size = vocab_size
        self.differentiated = any(
            in_autodiff(i.op_name) for i in module.instructions.values() if i.op_name
        )
        self._score_keys: set[str] = set()
        self._attention_keys: list[str] = []

    def classify(self, ops: list[hlo.ExecutedOp]) -> dict[str, OpClass]:
        self._find_attention_score_products(ops)
        out: dict[str, OpClass] = {}
        for e in ops:
            c = self.classify_op(e.instruction)
            if c.op_class == "other" and not self._has_metadata(e.instruction):
                c = self._inherit(e.instruction, out) or c
            out[e.instruction.name] = c
        return out

    def _has_metadata(self, inst: hlo.HloInstruction) -> bool:
        return any(i.op_name for i in self.module.fused_instructions(inst))

    def _inherit(self, inst: hlo.HloInstruction, done: dict[str, OpClass]) -> OpClass | None:
        """An op XLA created without metadata (e.g. a split reduction) belongs with its input."""
        for name in inst.operands:
            producer = done.get(name)
            if producer is not None and producer.op_class not in ("other", "data_movement"):
                return OpClass(
                    producer.op_class, f"no metadata; input {name} is {producer.op_class}"
                )
        return None

    # -- attention products ----------------------------------------------------------------

    def _attention_key(self, dot: hlo.HloInstruction) -> str:
        stack = self.module.stack(dot)
        if stack:
            return f"{stack[0].file}:{stack[0].line}"
        tokens, primitive = op_name_parts(dot.op_name)
        spec = [c for c in dot.op_name.split("/") if "->" in c]
        return re.sub(r"\d+", "#", "/".join(tokens + spec + [primitive]))

    def _operand_op_names(self, outer: hlo.HloInstruction, dot: hlo.HloInstruction) -> list[str]:
        """op_names of the ops producing a dot's operands (through its fusion's parameters)."""
        names = []
        for operand in dot.operands:
            inst = self.module.instructions.get(operand)
            if inst is not None and inst.opcode == "parameter" and outer is not dot:
                index = inst.parameter_number
                inst = (
                    self.module.instructions.get(outer.operands[index])
                    if index < len(outer.operands)
                    else None
                )
            for _ in range(3):  # look through bitcasts/copies XLA added without metadata
                if inst is None or inst.op_name or not inst.operands:
                    break
                inst = self.module.instructions.get(inst.operands[0])
            names.append(inst.op_name if inst is not None else "")
        return names

    def _is_attention_product(self, outer: hlo.HloInstruction, dot: hlo.HloInstruction) -> bool:
        """A batched dot in an attention scope: by its module path or frame or, for dots XLA
        rewrote without metadata, by the ops that produce its operands."""
        path = set(_lower_tokens(dot))
        if dot.opcode == "convolution":  # TPU writes batched products as convolutions
            return bool(path & _ATTENTION_SCOPES) and not path & (_QKV | _ATTENTION_OUT)
        if dot.opcode != "dot" or not dot.int_list_attr("lhs_batch_dims"):
            return False
        if path & _ATTENTION_SCOPES:
            return True
        stack = self.module.stack(dot)
        if stack and "attention" in f"{stack[0].file}:{stack[0].function}".lower():
            return True
        if dot.op_name:
            return False
        producers = self._operand_op_names(outer, dot)
        in_attention = any(
            {t.lower() for t in op_name_parts(n)[0]} & _ATTENTION_SCOPES for n in producers
        )
        return in_attention or len(dot.int_list_attr("lhs_batch_dims")) >= 2

    def _attention_kind_by_shape(self, outer: hlo.HloInstruction, dot: hlo.HloInstruction) -> str:
        """Scores or context for a dot without metadata. Forward: S = QK^T has the [L, L]
        output, PV an [L, L] operand. Backward: dP = dO V^T has the [L, L] output (context),
        dV = P^T dO reads the forward P (context), dQ, dK read the backward dS (scores)."""

        def square(shape: hlo.Shape) -> bool:
            return len(shape.dims) >= 2 and shape.dims[-1] == shape.dims[-2]

        producers = self._operand_op_names(outer, dot)
        backward = any("transpose(" in n for n in producers)
        if square(dot.shape):
            return "attention_context" if backward else "attention_scores"
        if not backward:
            return "attention_context"
        for operand, producer in zip(dot.operands, producers):
            inst = self.module.instructions.get(operand)
            if inst is not None and square(inst.shape):
                return "attention_scores" if "transpose(" in producer else "attention_context"
        return "attention_context"

    def _find_attention_score_products(self, ops: list[hlo.ExecutedOp]):
        for e in ops:
            dot = _matmul_instruction(self.module, self.module.fused_instructions(e.instruction))
            if dot is None or not dot.op_name or self._has_vocab(dot):
                continue
            if not self._is_attention_product(e.instruction, dot):
                continue
            key = self._attention_key(dot)
            if "transpose(" not in dot.op_name and key not in self._attention_keys:
                self._attention_keys.append(key)
        if self._attention_keys:
            self._score_keys = {self._attention_keys[0]}
            # Two attention products per layer: alternate score, context, score, ...
            self._score_keys.update(self._attention_keys[2::2])

    # -- per-op rules ----------------------------------------------------------------------

    def _has_vocab(self, inst: hlo.HloInstruction) -> bool:
        if not self.vocab_size:
            return False
        shapes = [inst.shape] + [
            self.module.instructions[o].shape
            for o in inst.operands
            if o in self.module.instructions
        ]
        return any(self.vocab_size in s.dims for s in shapes if not s.is_tuple)

    def _matmul_class(self, outer: hlo.HloInstruction, dot: hlo.HloInstruction) -> OpClass:
        if dot.opcode == "custom-call" and _ATTENTION_TARGETS.search(
            dot.custom_call_target + " " + dot.op_name
        ):
            return OpClass("attention_fused", f"custom call {dot.custom_call_target}")
        tokens = _lower_tokens(dot)
        if self._has_vocab(dot):
            return OpClass("mlm_head", f"vocabulary-sized dimension ({self.vocab_size})")
        if self._is_attention_product(outer, dot):
            if not dot.op_name:
                kind = self._attention_kind_by_shape(outer, dot)
                return OpClass(kind, "batched dot without metadata, by operand shapes/producers")
            key = self._attention_key(dot)
            kind = "attention_scores" if key in self._score_keys else "attention_context"
            return OpClass(kind, f"batched dot at {key}")
        path = "/".join(tokens)
        if _MLM & set(tokens):
            return OpClass("mlm_head", f"module path {path}")
        if _QKV & set(tokens):
            return OpClass("qkv_projection", f"module path {path}")
        for i, t in enumerate(tokens):
            if re.search(r"attn|attention", t) and _ATTENTION_OUT & set(tokens[i + 1 :]):
                return OpClass("attention_output", f"module path {path}")
        if _FFN & set(tokens):
            return OpClass("feed_forward", f"module path {path}")
        return OpClass("matmul_other", f"module path {path or '(none)'}")

    def classify_op(self, inst: hlo.HloInstruction) -> OpClass:
        module = self.module
        inner = [i for i in module.fused_instructions(inst) if i.opcode not in hlo.FREE_OPCODES]
        if not inner:
            inner = [inst]
        opcodes = {i.opcode for i in inner}
        if opcodes & hlo.COLLECTIVE_OPCODES:
            return OpClass("collectives", ",".join(sorted(opcodes & hlo.COLLECTIVE_OPCODES)))
        named = [i for i in inner if i.op_name]
        if self.differentiated and named and not any(in_autodiff(i.op_name) for i in named):
            if any(_is_loss(module, i) for i in named):
                return OpClass("loss", "loss code outside autodiff")
            if _matmul_instruction(module, inner) is not None:
                return OpClass("optimizer_matmul", "matrix product outside autodiff")
            return OpClass("optimizer", "outside autodiff (after the gradients)")
        dot = _matmul_instruction(module, inner)
        if dot is not None:
            return self._matmul_class(inst, dot)
        if any(_is_loss(module, i) for i in named):
            return OpClass("loss", "frames in a *loss* file")
        votes: dict[str, float] = {}
        for i in inner:
            hint = _hint(module, i)
            if hint:
                votes[hint] = votes.get(hint, 0.0) + max(i.shape.size, 1)
        if votes:
            best = max(votes, key=votes.get)
            return OpClass(best, "votes " + ", ".join(f"{k}={v:g}" for k, v in votes.items()))
        if any(_is_residual_add(module, i) for i in inner):
            return OpClass("residual", "add of two full-size tensors")
        dense_scopes = _QKV | _ATTENTION_OUT | _FFN | _MLM | {"pooler", "classifier"}
        for i in named:
            if set(_lower_tokens(i)) & dense_scopes and i.opcode not in _MOVEMENT_OPCODES:
                return OpClass("bias", f"elementwise/reduce in a Dense scope {i.op_name}")
        return self._movement_class(inst, opcodes)

    def _movement_class(self, inst: hlo.HloInstruction, opcodes: set[str]) -> OpClass:
        """Names an op that computes nothing (see rule 4), or `other`."""
        what = ",".join(sorted(opcodes))
        moves = opcodes <= _ASYNC_MOVE_OPCODES | {"custom-call"} and (
            opcodes & _ASYNC_MOVE_OPCODES or inst.custom_call_target == "ConcatBitcast"
        )
        if moves:
            on_chip = [
                a
                for shape in [inst.shape]
                + [self.module.instructions[o].shape for o in inst.operands]
                for a in shape.arrays()
                if a.memory_space not in hlo.OFF_CHIP_MEMORY_SPACES and a.dims
            ]
            return OpClass("memory_moves" if on_chip else "data_movement", what)
        if not opcodes <= _MOVEMENT_OPCODES:
            return OpClass("other", what)
        if "convert" in opcodes and opcodes <= {"convert", "bitcast", "reshape", "copy", "tuple"}:
            return OpClass("casts", what)
        if opcodes & {"concatenate", "pad"}:
            return OpClass("concat_pad", what)
        return OpClass("data_movement", what)


@dataclasses.dataclass(frozen=True)
class CostedOp:
    """An executed op, its class and its cost (one execution's)."""

    op: hlo.ExecutedOp
    op_class: OpClass
    cost: hlo.OpCost


def costed_ops(
    module: hlo.HloModule,
    executed: list[hlo.ExecutedOp],
    *,
    vocab_size: int | None = None,
    visited: float = 1.0,
) -> list[CostedOp]:
    """Each of `executed` with its class and its cost (`hlo.op_cost`; the block-skipping
    attention at the `visited` share of its block pairs): what the compile report's roofline and
    the profiler's measured classes both add up by class."""
    classes = Classifier(module, vocab_size=vocab_size).classify(executed)
    return [
        CostedOp(op, classes[op.instruction.name], hlo.op_cost(module, op.instruction, visited))
        for op in executed
    ]
