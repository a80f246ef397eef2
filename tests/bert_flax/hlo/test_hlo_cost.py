"""The HLO reader: shapes, executed ops, and FLOP/byte counts against XLA's own cost analysis."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from bert_flax import hlo


def compiled_module(fn, *args):
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, hlo.parse_module(compiled.as_text())


def totals(module):
    flops = bytes_ = trans = 0.0
    for e in module.executed_ops():
        cost = hlo.op_cost(module, e.instruction)
        flops += cost.flops * (e.count or 1)
        bytes_ += cost.bytes * (e.count or 1)
        trans += cost.transcendentals * (e.count or 1)
    return flops, bytes_, trans


def test_parse_shape():
    assert hlo.parse_shape("f32[8,128]{1,0}") == hlo.Shape("f32", (8, 128))
    assert hlo.parse_shape("bf16[4]{0}").bytes == 8
    t = hlo.parse_shape("(s32[], f32[2,3]{1,0}, /*index=2*/pred[5]{0})")
    assert t.is_tuple and t.size == 1 + 6 + 5 and t.bytes == 4 + 24 + 5


def test_lone_matmul_flops_and_bytes_are_exact():
    a, b = jnp.ones((96, 80)), jnp.ones((80, 48))
    compiled, module = compiled_module(jnp.matmul, a, b)
    flops, bytes_, _ = totals(module)
    assert flops == 2 * 96 * 80 * 48
    assert bytes_ == 4 * (96 * 80 + 80 * 48 + 96 * 48)
    assert compiled.cost_analysis()["flops"] == pytest.approx(flops)


def test_mlp_gradient_matches_xla_cost_analysis():
    def loss(w1, w2, x):
        h = jnp.tanh(x @ w1)
        h = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-6)
        return jax.nn.log_softmax(h @ w2).sum()

    args = (jnp.ones((64, 128)), jnp.ones((128, 32)), jnp.ones((16, 64)))
    compiled, module = compiled_module(jax.grad(loss, argnums=(0, 1)), *args)
    flops, bytes_, trans = totals(module)
    xla = compiled.cost_analysis()
    assert flops == pytest.approx(xla["flops"], rel=0.02)
    assert trans == pytest.approx(xla["transcendentals"], rel=0.02)
    assert bytes_ == pytest.approx(xla["bytes accessed"], rel=0.1)


def test_gather_reads_only_the_rows_it_takes():
    table = jnp.ones((30000, 64))
    ids = jnp.arange(32)
    _, module = compiled_module(
        lambda t, i: nn.Embed(30000, 64).apply({"params": {"embedding": t}}, i), table, ids
    )
    _, bytes_, _ = totals(module)
    assert bytes_ < 10 * 32 * 64 * 4  # far below the 7.7 MB table


def test_while_loop_bodies_count_once_per_trip():
    def body(_, x):
        return x @ x

    _, module = compiled_module(lambda x: jax.lax.fori_loop(0, 5, body, x), jnp.ones((32, 32)))
    dots = [
        e
        for e in module.executed_ops()
        if any(i.opcode == "dot" for i in module.fused_instructions(e.instruction))
    ]
    assert dots and all(e.count == 5 for e in dots)
    assert totals(module)[0] >= 5 * 2 * 32**3


def test_frames_name_the_python_function():
    def my_layer(x):
        return jnp.tanh(x) * 2

    _, module = compiled_module(my_layer, jnp.ones((8, 8)))
    functions = {
        f.function
        for e in module.executed_ops()
        for i in module.fused_instructions(e.instruction)
        for f in module.stack(i)
    }
    assert any("my_layer" in f for f in functions)


def test_not_hlo_text_is_a_clear_error():
    with pytest.raises(ValueError, match="HloModule"):
        hlo.parse_module("hello")


def test_computations_on_another_execution_thread_close_where_they_end():
    """TPU v5p offloads scatters to SparseCore: its computations end `}, execution_thread=...`."""
    text = """HloModule m

%on_sparsecore (p: f32[4]) -> f32[4] {
  ROOT %p = f32[4]{0} parameter(0)
}, execution_thread="sparsecore"

%fused_computation.1.clone (q: f32[4]) -> bf16[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %convert.1 = bf16[4]{0} convert(%q)
}

ENTRY %main (x: f32[4]) -> bf16[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %fusion.1 = bf16[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation.1.clone
}
"""
    module = hlo.parse_module(text)
    assert set(module.computations) == {"on_sparsecore", "fused_computation.1.clone", "main"}
    (fusion,) = [i for i in module.computations["main"].instructions if i.opcode == "fusion"]
    assert [i.opcode for i in module.fused_instructions(fusion)] == ["parameter", "convert"]


def test_pallas_gpu_attention_kernels_are_charged_their_products():
    """The Triton kernels of `pallas_attention.pallas_gpu_attention` (as a CUDA compile names them):
    2 products of [length, length] x head_dim a head forward, 7 backward, none to preprocess."""
    rows, length, heads, dim = 2, 256, 4, 64
    qkv = f"bf16[{rows},{length},{heads},{dim}]{{3,2,1,0}}"
    call = (
        '%{name} = {result} custom-call({args}), custom_call_target="__gpu$xla.gpu.triton", '
        'metadata={{op_name="jit(loss)/{scope}/pallas_call"}}'
    )
    kernels = {
        "forward": ("jvp(jit(mha))/mha_forward", qkv, "%q, %k, %v, %s"),
        "backward": ("transpose(jvp(mha_backward))", qkv, "%q, %k, %v, %s, %q, %q"),
        "preprocess": ("transpose(jvp(preprocess_backward))/mha_preprocess_backward",
                       f"f32[{rows},{heads},{length}]{{2,1,0}}", "%q, %q"),
    }  # fmt: skip
    calls = kernels.items()
    lines = [
        "HloModule m\n",
        f"ENTRY %main (q: {qkv}, k: {qkv}, v: {qkv}, s: s32[{rows},{length}]) -> {qkv} {{",
        *(f"  %{n} = {qkv} parameter({i})" for i, n in enumerate("qkv")),
        f"  %s = s32[{rows},{length}]{{1,0}} parameter(3)",
        *("  " + call.format(name=n, result=r, args=a, scope=s) for n, (s, r, a) in calls),
        f"  ROOT %out = {qkv} copy(%forward)",
        "}",
    ]
    module = hlo.parse_module("\n".join(lines))
    by_name = {i.name: i for i in module.computations["main"].instructions}
    product = 2.0 * rows * heads * length * length * dim
    assert hlo.kernel_flops(module, by_name["forward"])[0] == 2 * product
    assert hlo.kernel_flops(module, by_name["backward"])[0] == 7 * product
    assert hlo.kernel_flops(module, by_name["preprocess"]) == (0.0, 0.0)


@pytest.mark.parametrize(
    "target, lhs, rhs, result, contracting, flops",
    [  # a product with a bias-GELU epilogue, and a batched one (the layout of a real H100 compile)
        ("__cublas$lt$matmul", "bf16[256,768]", "bf16[768,3072]", "bf16[256,3072]", '"1"',
         2 * 256 * 768 * 3072),
        ("__cublas$gemm", "f32[4,16,32]", "f32[4,32,8]", "f32[4,16,8]", '"2"', 2 * 4 * 16 * 8 * 32),
    ],
)  # fmt: skip
def test_cublas_products_are_charged_their_flops(target, lhs, rhs, result, contracting, flops):
    config = (
        '{"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":'
        f'{{"lhs_contracting_dimensions":[{contracting}],"rhs_contracting_dimensions":["0"],'
        '"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"epilogue":"BIAS_GELU"}}'
    )
    text = "\n".join([
        "HloModule m\n",
        f"ENTRY %main (a: {lhs}, b: {rhs}) -> {result} {{",
        f"  %a = {lhs} parameter(0)",
        f"  %b = {rhs} parameter(1)",
        f"  %mm = ({result}, s8[4194304]{{0}}) custom-call(%a, %b), "
        f'custom_call_target="{target}", backend_config={config}',
        f"  ROOT %out = {result} get-tuple-element(%mm), index=0",
        "}",
    ])  # fmt: skip
    module = hlo.parse_module(text)
    product = next(i for i in module.computations["main"].instructions if i.name == "mm")
    assert hlo.kernel_flops(module, product) == (flops, 0.0)
    assert hlo.op_cost(module, product).matmul_flops == flops
