"""Everything compiles for TPU and GPU: the run's real steps on compile-only v5e devices (libtpu,
no TPU) and an H100 (jax's CUDA plugin, no GPU).

Each variant is compiled once, with tiny shapes, and checked for what can go wrong: the program
holds the kernels and collectives its config implies, and the memory and FLOPs that XLA reports
agree with the shapes.
"""

import functools
import logging
import re
import subprocess
import sys

import numpy as np
import pytest

from bert_flax import hlo, sharding
from bert_flax.aot import largest_batch, packings, program, roofline, targets
from bert_flax.hlo import classify
from bert_flax.train.setup import create_train_program
from configs import bert_base, tiny
from tests.paths import ROOT

V5E_4 = targets.target("v5e-4")
H100 = targets.target("h100")
GIB = 2**30


@functools.cache
def devices_of(target: targets.Target) -> tuple:
    return tuple(targets.compile_only_devices(target))


def v5e_devices() -> tuple:
    return devices_of(V5E_4)


def tiny_config(mesh=(4, 1, 1), **model):
    config = tiny.get_config()
    config.data.synthetic = True
    config.train.batch_size = config.eval.batch_size = 8
    config.mesh.shape = mesh
    config.model.update(model)
    return config


def compiled(config) -> tuple[program.Compiled, roofline.Report]:
    steps = program.compile_steps(config, list(v5e_devices()))
    return steps, roofline.report(steps, V5E_4)


@functools.cache
def compiled_tiny(mesh=(4, 1, 1), optimizer="adamw") -> tuple[program.Compiled, roofline.Report]:
    """The tiny config's steps on v5e-4 (shared by the tests of one worker)."""
    config = tiny_config(mesh)
    config.optimizer.name = optimizer
    return compiled(config)


def custom_calls(executable) -> set[str]:
    return {
        line.split('custom_call_target="')[1].split('"')[0]
        for line in executable.as_text().splitlines()
        if 'custom_call_target="' in line
    }


def kinds(report: roofline.Report) -> set[str]:
    return {c.kind for c in report.collectives}


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_every_target_names_its_chips(name):
    target = targets.TARGETS[name]
    devices = targets.compile_only_devices(target)
    assert len(devices) == target.chips
    assert {d.device_kind for d in devices} == {target.chip.name}


@pytest.mark.parametrize("backend_up", [False, True], ids=["fresh process", "CPU backend up"])
def test_the_cuda_plugin_registers_before_and_after_jax_starts_its_backends(backend_up):
    """jax discovers plugins once, when its backends start: `make venv`'s plugin, outside
    site-packages, is registered in a fresh process and in one already running on the CPU."""
    start = "import jax; print(jax.devices()[0].platform); " if backend_up else ""
    code = start + (
        "from bert_flax.aot import targets; "
        "print(targets.compile_only_devices(targets.target('h100'))[0].device_kind)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["cpu"] * backend_up + H100.chip.name.split()


def test_a_missing_cuda_plugin_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setattr(targets, "_importable", lambda module: False)
    monkeypatch.setattr(targets, "_VENDORED_CUDA_PLUGIN", tmp_path / "cuda_plugin")
    with pytest.raises(FileNotFoundError, match=r"`make venv` installs it.*jax-cuda12-pjrt=="):
        targets.compile_only_devices(H100)


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(ValueError, match="v5e-8"):
        targets.target("v5e-7")


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("impl", ["xla", "splash", "cudnn"])
def test_attention_backends_compile_for_tpu_on_a_data_mesh(impl):
    config = tiny_config(attention_impl=impl, attention_dropout_rate=0.0)
    steps, report = compiled_tiny() if impl == "xla" else compiled(config)
    # Splash is Mosaic-compiled, not interpreted: its kernel is a TPU custom call, in both steps.
    mosaic = "tpu_custom_call"
    assert (mosaic in custom_calls(steps.train)) == (impl == "splash")
    assert (mosaic in custom_calls(steps.eval)) == (impl == "splash")
    # Pure data parallelism: gradients are all-reduced, parameters never gathered.
    assert "all-reduce" in kinds(report) and "all-gather" not in kinds(report)
    assert report.train_memory.total > report.param_bytes + report.optimizer_bytes > 0
    assert report.fits and report.roofline_step_s > 0
    # Every kernel charged its FLOPs; XLA's count cannot see into the splash kernels.
    assert not report.uncounted_kernels
    if impl == "splash":
        fused = report.classes["attention_fused"].flops
        assert fused > 0 and report.hlo_flops == pytest.approx(report.xla_flops + fused, rel=0.02)
    assert not set(report.classes) & set(classify.UNNAMED_CLASSES) or (
        sum(report.classes[c].seconds for c in classify.UNNAMED_CLASSES)
        < 0.1 * report.roofline_step_s
    )


@pytest.mark.slow(seconds=30)
def test_block_sparse_ffn_compiles_its_mosaic_kernels():
    config = tiny_config(hidden_size=256, intermediate_size=1024)
    dense_steps, dense = compiled(config)
    config.model.block_sparse.update(enabled=True, block_size=128, density=0.5)
    steps, report = compiled(config)
    # Forward, input gradient and weight gradient of both FFN layers, per batch shard.
    assert "tpu_custom_call" in custom_calls(steps.train)
    assert "tpu_custom_call" in custom_calls(steps.eval)
    assert "tpu_custom_call" not in custom_calls(dense_steps.train)
    ffn = 2 * 2 * 256 * 1024 * 4  # two layers of two float32 FFN kernels
    assert report.param_bytes == pytest.approx(dense.param_bytes - ffn / 2, rel=0.01)
    # The kernels' FLOPs counted from their shapes: forward, input and weight gradients of 2 x 2
    # layers, 2 FLOPs per multiply-add of each stored half of a 256 x 1024 kernel, with each of
    # a device's 256 tokens (8 rows of 128 over 4 devices).
    assert not report.uncounted_kernels
    kernels = 3 * 2 * 2 * 2 * 256 * (256 * 1024 * 0.5)
    assert kernels <= report.classes["feed_forward"].flops < 1.05 * kernels
    assert report.classes["feed_forward"].flops < dense.classes["feed_forward"].flops / 1.8


@pytest.mark.slow(seconds=40)
def test_fsdp_gathers_parameters_and_scatters_gradients():
    _, data = compiled_tiny((4, 1, 1))
    _, fsdp = compiled_tiny((1, 4, 1))
    # TPU writes a reduce-scatter as an "all-reduce-scatter" fusion (`roofline.collectives`).
    assert {"all-gather", "reduce-scatter"} <= kinds(fsdp)
    assert "all-gather" not in kinds(data)
    # Parameters and Adam's moments are split four ways along the embed dim.
    assert fsdp.param_bytes < data.param_bytes / 2
    assert fsdp.optimizer_bytes < data.optimizer_bytes / 2
    # The same work a device: the data-parallel step's FLOPs.
    assert fsdp.xla_flops == pytest.approx(data.xla_flops, rel=0.2)


@pytest.mark.slow(seconds=30)
def test_tensor_parallel_rules_split_the_ffn():
    _, report = compiled_tiny((2, 1, 2))
    _, data = compiled_tiny((4, 1, 1))
    assert report.mesh == {"data": 2, "fsdp": 1, "model": 2}
    assert report.param_bytes < data.param_bytes  # "mlp", "joined_kv", "vocab" over model
    assert "all-reduce" in kinds(report)


@pytest.mark.slow(seconds=60)
@pytest.mark.parametrize("optimizer", ["lamb", "adamw", "muon", "shampoo", "soap"])
def test_optimizers_compile_for_tpu(optimizer):
    _, report = compiled_tiny(optimizer=optimizer)
    # Every optimizer keeps state; Adam-like ones two parameter-shaped moments, the others at
    # least a momentum.
    ratio = report.optimizer_bytes / report.param_bytes
    assert ratio >= (2.0 if optimizer in ("lamb", "adamw") else 1.0), ratio
    assert report.xla_flops > 0 and report.fits


@pytest.mark.slow(seconds=60)
def test_bert_base_shapes_fit_and_count_the_model_flops():
    config = tiny_config(preset="base", num_layers=2, attention_impl="splash")
    config.model.attention_dropout_rate = 0.0
    config.train.dtype = "bfloat16"
    _, report = compiled(config)
    params = report.model["parameters"]
    assert 35e6 < params < 45e6  # two of BERT-base's layers (7.1M each) and its embeddings
    # Data parallel: each device holds all float32 parameters and two Adam moments of them.
    assert report.param_bytes == params * 4 and report.optimizer_bytes >= 2 * params * 4
    assert report.train_memory.arguments >= report.param_bytes + report.optimizer_bytes
    # XLA's count of the program (per device) matches 6 x parameters x tokens + attention.
    per_device = report.model_flops_per_step / report.devices
    assert report.xla_flops == pytest.approx(per_device, rel=0.35)
    # The roofline's own count of the compiled ops agrees with XLA's (TPU writes attention's
    # batched products as dilated convolutions: `hlo._window_taps`).
    assert report.hlo_flops == pytest.approx(report.xla_flops, rel=0.05)
    assert report.fits and report.model_flops_utilisation < 1


# Each platform's flash kernel over segments, compiled ("auto"'s: the one that skips blocks): its
# custom call, its forward kernels and those of its backward pass.
PLATFORM_KERNELS = {
    "tpu": ("packed_tpu", "tpu_custom_call", {"packed_attention_fwd"},
            {"packed_attention_dq", "packed_attention_dkv"}),
    "cuda": ("packed_gpu", "__gpu$xla.gpu.triton", {"packed_attention_fwd"},
             {"packed_attention_dq", "packed_attention_dkv"}),
}  # fmt: skip


def pallas_kernels(executable, call_target: str, names: set[str]) -> set[str]:
    """Which of `names` the program's `call_target` custom calls run (by their instruction name
    or op_name: Mosaic keeps the kernel's name, Triton's call its `pallas_call` scope)."""
    calls = [line for line in executable.as_text().splitlines()
             if f'custom_call_target="{call_target}"' in line]  # fmt: skip
    return {n for n in names for c in calls if re.search(rf"%{n}_|/{n}/pallas_call", c)}


def narrow_512_preset(target: targets.Target):
    """configs/bert_base.py at 512, one layer of width 256 (to compile fast), one row a device of
    `target`; and those devices."""
    config = bert_base.get_config("phase2")
    config.model.update(num_layers=1, hidden_size=256, num_heads=4, intermediate_size=1024)
    config.data.synthetic = True
    config.train.packing_hparams, config.train.accumulation = "none", 1
    devices = list(devices_of(target))
    config.train.batch_size = config.eval.batch_size = len(devices)
    config.mesh.shape = (len(devices), 1, 1)
    return config, devices


@pytest.mark.slow(seconds=60)
@pytest.mark.parametrize("target", [V5E_4, H100], ids=lambda t: t.name)
def test_the_512_presets_compile_their_platforms_flash_kernel(target):
    """configs/bert_base.py at 512 ('auto' attention, narrowed to one layer of width 256 to
    compile fast) gets the block-skipping kernel, Mosaic on a v5e and Triton on an H100,
    compiled, never in interpret mode (which would leave no kernel call: `interpret=True` lowers
    to plain HLO)."""
    config, devices = narrow_512_preset(target)
    assert config.model.attention_impl == "auto"
    steps = program.compile_steps(config, devices)
    kernel, call_target, forward, backward = PLATFORM_KERNELS[target.platform]
    assert steps.program.attention_impl == kernel
    assert roofline.report(steps, target).model["attention"] == kernel
    names = forward | backward
    assert pallas_kernels(steps.train, call_target, names) == names
    assert pallas_kernels(steps.eval, call_target, names) == forward


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("target", [V5E_4, H100], ids=lambda t: t.name)
def test_gpu_programs_run_layer_norm_as_cudnn_kernels_and_charge_them(target):
    """`sharding.COMPILER_OPTIONS`: an H100 program runs the forward pass of each LayerNorm (the
    embeddings', two a layer, the MLM head's) as cuDNN's fused kernel, which the roofline knows;
    a TPU program has none."""
    config, devices = narrow_512_preset(target)
    steps = program.compile_steps(config, devices, evaluate=False)
    norms = steps.train.as_text().count('custom_call_target="__cudnn$norm"')
    assert norms == (1 + 2 + 1 if target.platform == "cuda" else 0)
    assert roofline.report(steps, target).uncounted_kernels == []


# The flash kernels that visit every block, which "auto" chose before the skipping ones: still
# selectable, still compiled.
DENSE_KERNELS = {
    "splash": ("tpu_custom_call", {"splash_mha_fwd"}, {"splash_mha_dkv", "splash_mha_dq"}),
    "pallas_gpu": ("__gpu$xla.gpu.triton", {"mha_forward"},
                   {"mha_preprocess_backward", "mha_backward"}),
}  # fmt: skip


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize(("impl", "target"), [("splash", V5E_4), ("pallas_gpu", H100)],
                         ids=["splash v5e", "pallas_gpu H100"])  # fmt: skip
def test_the_kernels_that_visit_every_block_compile_for_their_platform(impl, target):
    """attention_impl="splash" on a v5e, "pallas_gpu" on an H100: the forward kernel in both
    steps, the backward kernels in the train step."""
    config, devices = narrow_512_preset(target)
    config.model.attention_impl = impl
    steps = program.compile_steps(config, devices)
    call_target, forward, backward = DENSE_KERNELS[impl]
    assert pallas_kernels(steps.train, call_target, forward | backward) == forward | backward
    assert pallas_kernels(steps.eval, call_target, forward | backward) == forward


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize(("impl", "target"), [("packed_tpu", V5E_4), ("packed_gpu", H100)],
                         ids=["packed_tpu v5e", "packed_gpu H100"])  # fmt: skip
def test_block_skipping_kernels_with_attention_dropout_compile(impl, target):
    """With attention dropout (its counter-based mask: int32 multiplies and logical shifts in
    the kernels) the train step compiles the forward, dQ and dK/dV kernels for the target."""
    config, devices = narrow_512_preset(target)
    config.model.update(attention_impl=impl, attention_dropout_rate=0.1)
    steps = program.compile_steps(config, devices)
    names = {"packed_attention_fwd", "packed_attention_dq", "packed_attention_dkv"}
    call_target = "tpu_custom_call" if impl == "packed_tpu" else PLATFORM_KERNELS["cuda"][1]
    assert pallas_kernels(steps.train, call_target, names) == names


# Matrix products per (query, key) pair and head dimension of each block-skipping kernel, by hand
# (bert_flax/kernels/packed_attention_*.py): the forward QK^T, PV; dQ: QK^T, dO V^T, dS K; dK and
# dV: QK^T, P^T dO, dO V^T, dS^T Q.
SKIPPING_PRODUCTS = {"packed_attention_fwd": 2, "packed_attention_dq": 3, "packed_attention_dkv": 4}


def test_a_sliding_window_is_charged_only_the_blocks_within_it():
    """At 512 in blocks of 128 a window of 128 (64 tokens either side) reaches 2, 3, 3 and 2 of
    the four kv blocks: padded rows of unknown lengths, charged all 16 block pairs without it,
    are charged 10 with it, and the task's synthetic packed rows less than without it."""
    config = bert_base.get_config("phase2")
    config.data.synthetic = True
    visited = packings.attention_visited_fraction(config, "")
    assert 0 < packings.attention_visited_fraction(config, "", window=128) < visited
    config.data.packed = False
    assert packings.attention_visited_fraction(config, "") == 1.0
    assert packings.attention_visited_fraction(config, "", window=128) == 10 / 16


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize(("impl", "target"), [("packed_tpu", V5E_4), ("packed_gpu", H100)],
                         ids=["packed_tpu v5e", "packed_gpu H100"])  # fmt: skip
def test_block_skipping_attention_is_charged_the_blocks_it_visits(impl, target):
    """The roofline charges each skipping kernel its dense FLOPs times the share of block pairs
    it visits in the packing's rows (the task's synthetic rows here: well under 1), not all; its
    bytes are its operands and results once (the blocks its programs loop over again come from
    cache), as for the kernels that visit every block."""
    config, devices = narrow_512_preset(target)
    config.model.update(attention_impl=impl, attention_dropout_rate=0.0)
    visited = packings.attention_visited_fraction(config, "")
    assert 0 < visited < 0.9
    steps = program.compile_steps(config, devices, attention_visited_fraction=visited)
    report = roofline.report(steps, target)
    assert report.uncounted_kernels == []
    assert report.attention_visited_fraction == visited
    module = hlo.parse_module(steps.train.as_text())
    charged = {}
    for op in module.executed_ops():
        inst = op.instruction
        for name in SKIPPING_PRODUCTS:
            if inst.opcode == "custom-call" and re.search(
                rf"^{name}_|/{name}/", inst.name + " " + inst.op_name
            ):
                charged[name] = hlo.op_cost(module, inst, visited)
    assert set(charged) == set(SKIPPING_PRODUCTS)
    # One row a device, 4 heads of 64, rows of 512 tokens.
    dense_pairs = 1 * 4 * 512 * 512
    for name, products in SKIPPING_PRODUCTS.items():
        dense = 2 * products * dense_pairs * 64
        assert charged[name].flops == pytest.approx(visited * dense, rel=1e-6), name
    if impl == "packed_gpu":
        # q, k, v and out, the log-sum-exp (float32), the segment ids and the two range bounds of
        # the 4 query blocks (int32), once each.
        array = dense_pairs // 512 * 64 * 2
        expected = 4 * array + 4 * 4 * 512 + 4 * 512 + 2 * 4 * 4
        assert charged["packed_attention_fwd"].bytes == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    ("impl", "target"), [("pallas_gpu", V5E_4), ("splash", H100)], ids=["GPU on TPU", "TPU on GPU"]
)
def test_a_kernel_of_the_other_accelerator_fails_when_the_program_is_built(impl, target):
    config = tiny_config(mesh=(len(devices_of(target)), 1, 1), attention_impl=impl)
    config.model.attention_dropout_rate = 0.0
    with pytest.raises(ValueError, match=r"Pallas interpret mode.*attention_impl='auto'"):
        program.compile_steps(config, list(devices_of(target)))
    config.model.attention_interpret = True  # asked for: built (interpreted)
    create_train_program(config, sharding.mesh_of(config.mesh, list(devices_of(target))))


def test_largest_batch_bisects_to_the_last_fitting_size(monkeypatch, caplog):
    compiled_rows = []

    def fake_compile_for(config, target, packing_factor, devices, **fractions):
        rows = config.train.batch_size
        compiled_rows.append(rows)
        memory = roofline.Memory(0, 0, 0, rows * targets.GIB / 4, 0)
        return type("R", (), {"fits": rows <= 44, "peak_memory": memory.total,
                              "compile_s": {"train": 1.0}})()  # fmt: skip

    monkeypatch.setattr(roofline, "compile_for", fake_compile_for)
    config = tiny_config((4, 1, 1))
    with caplog.at_level(logging.INFO):
        rows, report = largest_batch.largest_batch(config, V5E_4)
    assert rows == 44 and report.fits  # 11 rows on each of 4 data shards
    assert max(compiled_rows) == 64 and len(compiled_rows) <= 8
    assert config.train.batch_size == 8  # the caller's config is left as it was
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("largest")]
    assert len(progress) == len(compiled_rows)  # one line a compile: a long search shows progress
    assert "44 rows fit (HBM 11.00 of 16.00 GiB" in " ".join(progress)


def test_model_flops_match_a_hand_count():
    cfg = type("C", (), {"num_layers": 2, "hidden_size": 4, "vocab_size": 10})()
    params = {"embeddings": {"word_embeddings": {"embedding": np.zeros((10, 4))}},
              "layer": {"kernel": np.zeros((4, 4))}}  # fmt: skip
    row = type("S", (), {"max_seq_length": 8, "max_predictions_per_pack": 3})()
    # per token 6 * 16 + 12 * 2 * 4 * 8 = 864; 8 tokens; decoder 6 * 10 * 4 * 3 = 720; 2 rows
    assert roofline.model_flops_per_step(params, cfg, 2, row) == 2 * (864 * 8 + 720)
    # Sequences needing a quarter of the row's scores: attention 12 * 2 * 4 * 8 / 4 = 192 a token.
    assert roofline.model_flops_per_step(params, cfg, 2, row, 0.25) == 2 * ((96 + 192) * 8 + 720)


def test_the_needed_share_of_attention_is_the_rows_sum_of_squared_lengths():
    """`packings.attention_needed_fraction`: the task's synthetic packed rows, recounted here;
    padded rows of unknown lengths are one sequence filling the row."""
    from bert_flax.input_pipeline import synthetic

    config = bert_base.get_config("phase2")
    length, depth = config.data.max_seq_length, config.data.max_sequences_per_pack
    rows = synthetic.random_row_lengths(256, length, depth, config.seed)
    expected = np.mean([sum(n * n for n in row) / length**2 for row in rows])
    needed = packings.attention_needed_fraction(config, "")
    assert needed == pytest.approx(expected) and needed < 0.9
    assert needed <= packings.attention_visited_fraction(config, "")  # visited blocks hold it
    config.data.packed = False
    assert packings.attention_needed_fraction(config, "") == 1.0
