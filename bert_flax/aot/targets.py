"""The accelerators `bert_flax.aot` compiles for, and compile-only devices of each.

A target is what a researcher books (`v5e-8`, `v5p-8`, `h100`): its topology for XLA, and the
public figures of one chip that the compile report sets the program against (HBM size, peak
bfloat16 FLOP rate, HBM and interconnect bandwidth). `compile_only_devices(target)` builds
devices of the target on any host, no accelerator needed: TPU through libtpu's topology
descriptions, CUDA through the jax-cuda plugin's device-less compiler (both as `make venv`
installs them, outside site-packages, or installed where jax finds them).

    devices = compile_only_devices(TARGETS["v5e-8"])   # 8 "TPU v5 lite" devices, compile only
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import sys

import jax

GIB = 2**30

# Public per-chip figures. TPUs: Google Cloud's TPU architecture pages (v4, v5e, v5p, v6e),
# "peak compute per chip (bf16)", "HBM capacity / bandwidth", "interchip interconnect BW" (the
# Gbps figure, one direction). GPUs: NVIDIA's H100 / H200 SXM datasheets (dense bfloat16
# tensor-core rate, HBM3 / HBM3e bandwidth, NVLink 4 at 900 GB/s both directions).
TPU_DOCS = "cloud.google.com/tpu/docs/system-architecture-tpu-vm"
NVIDIA_DOCS = "NVIDIA H100 / H200 Tensor Core GPU datasheets (SXM)"


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str  # the device kind XLA reports
    hbm_bytes: float
    peak_flops: float  # bfloat16, dense, per chip
    hbm_bytes_per_s: float
    link_bytes_per_s: float  # interconnect, one direction, per chip
    source: str


CHIPS = {
    "v4": Chip("TPU v4", 32 * GIB, 275e12, 1200e9, 2400e9 / 8, TPU_DOCS),
    "v5e": Chip("TPU v5 lite", 16 * GIB, 197e12, 819e9, 1600e9 / 8, TPU_DOCS),
    "v5p": Chip("TPU v5", 95 * GIB, 459e12, 2765e9, 4800e9 / 8, TPU_DOCS),
    "v6e": Chip("TPU v6 lite", 32 * GIB, 918e12, 1640e9, 3584e9 / 8, TPU_DOCS),
    "h100": Chip("NVIDIA H100 80GB HBM3", 80e9, 989e12, 3.35e12, 450e9, NVIDIA_DOCS),
    "h200": Chip("NVIDIA H200", 141e9, 989e12, 4.8e12, 450e9, NVIDIA_DOCS),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """A bookable slice: `chips` of one `Chip`, as a topology XLA can compile for."""

    name: str
    chip: Chip
    platform: str  # "tpu" or "cuda"
    topology: str  # libtpu's "v5e:2x4"; CUDA: "1x1x1" (hosts x devices per host ...)
    chips_per_host_bounds: tuple[int, int, int] = (2, 2, 1)
    chip_config: str = "default"  # "megacore" fuses a v4 chip's two cores into one device

    @property
    def chips(self) -> int:
        dims = self.topology.split(":")[-1].split("x")
        count = 1
        for d in dims:
            count *= int(d)
        return count


def _tpu(name: str, chip: str, topology: str, bounds=(2, 2, 1), config="default") -> Target:
    return Target(name, CHIPS[chip], "tpu", f"{chip}:{topology}", bounds, config)


# Names as Cloud TPU spells them: v4 and v5p count TensorCores (two a chip), v5e and v6e chips.
TARGETS = {
    t.name: t
    for t in (
        _tpu("v4-8", "v4", "2x2x1", config="megacore"),
        _tpu("v5e-1", "v5e", "1x1", (1, 1, 1)),
        _tpu("v5e-4", "v5e", "2x2"),
        _tpu("v5e-8", "v5e", "2x4", (2, 4, 1)),
        _tpu("v5e-16", "v5e", "4x4", (2, 4, 1)),
        _tpu("v5e-256", "v5e", "16x16", (2, 4, 1)),
        _tpu("v5p-8", "v5p", "2x2x1"),
        _tpu("v6e-4", "v6e", "2x2"),
        _tpu("v6e-8", "v6e", "2x4", (2, 4, 1)),
        Target("h100", CHIPS["h100"], "cuda", "1x1x1"),
        Target("h200", CHIPS["h200"], "cuda", "1x1x1"),
    )
}

# libtpu and jax's CUDA plugin where `make venv` puts them: outside site-packages, so that runs
# on a CPU never find them (with libtpu importable, jax probes for a TPU at start-up and logs
# warnings; with the plugin, it tries to start a CUDA backend).
_VENDORED_LIBTPU = pathlib.Path(sys.prefix) / "libtpu" / "libtpu" / "libtpu.so"
_VENDORED_CUDA_PLUGIN = pathlib.Path(sys.prefix) / "cuda_plugin"
_CUDA_PLUGIN = "jax_plugins.xla_cuda12"


def target(name: str) -> Target:
    """The target called `name` (a key of `TARGETS`), or an error listing them."""
    if name not in TARGETS:
        raise ValueError(f"Unknown target {name!r}; choose one of {sorted(TARGETS)}.")
    return TARGETS[name]


def _use_libtpu() -> None:
    """Points jax at a libtpu: $TPU_LIBRARY_PATH, an installed `libtpu`, or `make venv`'s."""
    if os.environ.get("TPU_LIBRARY_PATH") or importlib.util.find_spec("libtpu"):
        return
    if not _VENDORED_LIBTPU.is_file():
        raise FileNotFoundError(
            "Compiling for TPU needs libtpu: `make venv` installs it, or pip install "
            '"jax[tpu]" (on a CPU machine that makes jax probe for a TPU at start-up), or set '
            "TPU_LIBRARY_PATH to a libtpu.so."
        )
    os.environ["TPU_LIBRARY_PATH"] = str(_VENDORED_LIBTPU)


def _quiet_libtpu() -> None:
    """Tells libtpu there is no TPU host to discover here (else it logs warnings on loading),
    and that other processes may load it too (it takes a lock file by default: two compiling
    processes, such as parallel tests, would fail)."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its package is not
        return False


def _use_cuda_plugin() -> None:
    """Registers jax's CUDA plugin: an installed one, or `make venv`'s (put on `sys.path` here).
    Also in a process whose backends are up (jax discovers plugins once, when they start)."""
    from jax._src import xla_bridge

    if not _importable(_CUDA_PLUGIN):
        if not (_VENDORED_CUDA_PLUGIN / "jax_plugins").is_dir():
            raise FileNotFoundError(
                "Compiling for CUDA needs jax's CUDA plugin: `make venv` installs it, or pip "
                f"install --no-deps --target {_VENDORED_CUDA_PLUGIN} "
                f'"jax-cuda12-plugin=={jax.__version__}" "jax-cuda12-pjrt=={jax.__version__}" '
                "(no CUDA libraries needed)."
            )
        sys.path.append(str(_VENDORED_CUDA_PLUGIN))
    xla_bridge._discover_and_register_pjrt_plugins()  # no-op once backends are up
    if "cuda" not in xla_bridge._backend_factories:
        importlib.import_module(_CUDA_PLUGIN).initialize()


def _cuda_target_config(chip: Chip) -> str:
    """A `stream_executor.GpuTargetConfigProto` (text) for a device-less CUDA compile."""
    return f"""
gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: {int(chip.hbm_bytes_per_s)}
  l2_cache_size: 52428800 clock_rate_ghz: 1.98 device_memory_size: {int(chip.hbm_bytes)}
  shared_memory_per_block_optin: 232448 cuda_compute_capability {{ major: 9 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 7 }}
runtime_version {{ major: 12 minor: 8 patch: 0 }}
device_description_str: "{chip.name}"
"""


def compile_only_devices(t: Target) -> list[jax.Device]:
    """Devices of `t` that jax can compile for (never run on), in topology order.

    Call before anything else initialises jax's backends in this process: the host's backend is
    kept to the CPU, so that libtpu never looks for a TPU here.
    """
    from jax.experimental import topologies

    try:
        jax.config.update("jax_platforms", "cpu")
    except RuntimeError:
        pass  # backends already up (libtpu, where installed, was probed then): nothing to keep
    if t.platform == "tpu":
        _use_libtpu()
        _quiet_libtpu()
        topology = topologies.get_topology_desc(
            platform="tpu",
            topology_name=t.topology,
            chip_config_name=t.chip_config,
            chips_per_host_bounds=t.chips_per_host_bounds,
            num_slices=1,
        )
    else:
        _use_cuda_plugin()
        topology = topologies.get_topology_desc(
            platform=t.platform, target_config=_cuda_target_config(t.chip), topology=t.topology
        )
    return list(topology.devices)
