"""`python -m bert_flax.aot` as a user types it: the report, its JSON, and user errors."""

import json
import os
import subprocess
import sys

import pytest

from bert_flax import errors
from tests.paths import ROOT


def compile_command(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bert_flax.aot", "--config=configs/tiny.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow(seconds=30)
def test_compile_command_reports_fit_flops_collectives_and_a_roofline(tmp_path):
    out = tmp_path / "tiny_v5e4.json"
    done = compile_command(
        "--target=v5e-4", "--packing_factor=corpus_like", f"--json={out}",
        "--config.train.batch_size=8", "--config.eval.batch_size=8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fits" in done.stdout and "(prediction)" in done.stdout
    assert "TPU" not in done.stderr  # libtpu loaded quietly, no probing for a local TPU
    report = json.loads(out.read_text())
    assert report["target"] == "v5e-4" and report["devices"] == 4
    assert report["mesh"] == {"data": 4, "fsdp": 1, "model": 1}
    assert 1.9 < report["packing_factor"] < 2.1  # the corpus-like histogram at 128, depth 3
    assert report["attention_visited_fraction"] == 1.0  # a row of 128 is one block: no skipping
    memory = report["train_memory"]
    assert memory["total"] == (
        memory["arguments"] + memory["outputs"] - memory["aliased"] + memory["temporaries"]
        + memory["code"]
    )  # fmt: skip
    assert report["fits"] and report["hbm_bytes"] == 16 * 2**30
    assert {c["kind"] for c in report["collectives"]} == {"all-reduce"}
    assert report["xla_flops"] > 0 and report["roofline_step_s"] > 0
    assert set(report["predicted"]) == {
        "roofline_step_s", "sequences_per_s", "model_flops_utilisation"
    }  # fmt: skip


@pytest.mark.slow(seconds=40)
def test_compile_command_compiles_for_a_gpu_with_its_kernel(tmp_path):
    """jax's CUDA plugin (`make venv`) found in a fresh process; 'auto' gets the block-skipping
    Triton kernel."""
    out = tmp_path / "tiny_h100.json"
    done = compile_command(
        "--target=h100", f"--json={out}", "--config.model.attention_impl=auto",
        "--config.model.attention_dropout_rate=0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attention=packed_gpu" in done.stdout and "fits" in done.stdout
    report = json.loads(out.read_text())
    assert report["target"] == "h100" and report["model"]["attention"] == "packed_gpu"
    assert report["hlo_flops"] > 0 and not report["uncounted_kernels"]


@pytest.mark.parametrize(
    "flags, phrase",
    [
        (["--target=v5e-7"], "v5e-8"),
        (["--packing_factor=many"], "web_like"),
        (["--packing_factor=web_like"], "lengths (1024, 2048, 4096, 8192)"),
        (["--target=h100", "--config.model.attention_impl=splash",
          "--config.model.attention_dropout_rate=0"], "attention_impl='auto'"),
    ],
    ids=["unknown target", "bad packing factor", "no long-context histogram at 128",
         "a TPU kernel for a GPU"],
)  # fmt: skip
def test_compile_user_errors(flags, phrase):
    done = compile_command(*flags)
    assert done.returncode == errors.USER_ERROR_EXIT_STATUS, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert phrase in done.stderr.strip().splitlines()[-1]


def test_a_cpu_run_never_sees_libtpu_or_the_cuda_plugin():
    """libtpu and jax's CUDA plugin sit outside site-packages (make venv): jax on a CPU neither
    probes for a TPU nor starts a CUDA backend."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_PLATFORMS", "TPU_"))}
    done = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.devices())"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0 and "CpuDevice" in done.stdout, done.stderr[-2000:]
    assert "libtpu" not in done.stderr and "TPU" not in done.stderr, done.stderr[-2000:]
    assert "cuda" not in done.stderr.lower(), done.stderr[-2000:]
