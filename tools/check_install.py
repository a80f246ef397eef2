"""Does `pip install packed-bert-flax[extra]` resolve on the machines researchers use?

    python tools/check_install.py                     # every target, with your pip config
    python tools/check_install.py --only macos-arm64 tpu-vm
    python tools/check_install.py --ignore-pip-config # plain PyPI view (no local mirrors/pins)

Builds the project's wheel once, then for each target runs

    pip install --dry-run --ignore-installed --only-binary=:all: --platform TAG ...
        --python-version 3.11 --implementation cp --target TMP --report REPORT WHEEL[extra]

and prints OK/FAIL with the resolved versions of jax, flax, optax, TensorFlow and torch (and
the accelerator runtime: libtpu, the CUDA plugin). Nothing is installed.

`--only-binary=:all:` (which pip requires with `--platform`) also rules out dependencies that
exist only as source distributions, such as `promise` (pulled in by tensorflow-datasets), which a
real install builds in seconds. When pip reports such a package, the script builds it here as a
wheel and retries with it on `--find-links`, but only if that wheel is pure Python
(`py3-none-any`, so the same on every platform); the output names every package built this way.

pip's `--platform` only filters wheel tags: it still evaluates environment markers
(`sys_platform`, `platform_machine`, ...) for the interpreter running it, so this script runs
pip with the target's marker environment patched in; otherwise the TensorFlow choice in
setup.py would be resolved for this machine instead of the target. Exit status 1 if any target
failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
GLIBC = 35  # manylinux tags up to glibc 2.35 (Ubuntu 22.04: Cloud TPU VMs, Colab, most GPU boxes)
SHOWN = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-datasets",
    "torch",
    "libtpu",
    "jax-cuda12-plugin",
)

# Runs pip's CLI with packaging's marker environment replaced by the target's.
RUNNER = """
import json, sys
import pip._vendor.packaging.markers as markers
target = json.loads(sys.argv[1])
host = markers.default_environment
markers.default_environment = lambda: {**host(), **target}
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def manylinux(arch: str) -> list[str]:
    return [f"manylinux_2_{minor}_{arch}" for minor in range(GLIBC, 16, -1)] + [
        f"manylinux2014_{arch}"  # pip adds manylinux2010/manylinux1 below it
    ]


LINUX_X86 = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
LINUX_ARM = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"}
MACOS_ARM = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"}


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    extra: str | None
    platforms: list[str]
    markers: dict[str, str]
    constraints: str | None = None
    note: str = ""


TARGETS = [
    Target("linux-x86_64", "cpu", manylinux("x86_64"), LINUX_X86, note="CPU box"),
    Target("linux-aarch64", "cpu", manylinux("aarch64"), LINUX_ARM, note="Graviton, Ampere"),
    Target("macos-arm64", "cpu", ["macosx_14_0_arm64"], MACOS_ARM, note="Apple silicon"),
    Target("tpu-vm", "tpu", manylinux("x86_64"), LINUX_X86, note="Cloud TPU VM"),
    Target("gpu-x86_64", "cuda", manylinux("x86_64"), LINUX_X86, note="NVIDIA GPU box"),
    Target("gpu-aarch64", "cuda", manylinux("aarch64"), LINUX_ARM, note="Grace Hopper"),
    Target("colab", None, manylinux("x86_64"), LINUX_X86, note="keeps Colab's tensorflow"),
    Target("ci", "test", manylinux("x86_64"), LINUX_X86, "constraints/ci.txt", "make test"),
]


def pip_env(ignore_config: bool) -> dict[str, str]:
    env = dict(os.environ)
    if ignore_config:  # PyPI only: no config files, no PIP_* pins or extra indexes
        keep = {"PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_INDEX_URL"}
        env = {k: v for k, v in env.items() if not k.startswith("PIP_") or k in keep}
        env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def build_wheel(out: pathlib.Path, env: dict[str, str]) -> pathlib.Path:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    (wheel,) = out.glob("packed_bert_flax-*.whl")
    return wheel


def resolve(
    target: Target, wheel: pathlib.Path, python: str, env: dict[str, str], work: pathlib.Path
) -> tuple[bool, dict[str, str], str]:
    """(resolved?, {name: version}, pip's last error lines)."""
    report = work / f"{target.name}.json"
    major, minor = python.split(".")[:2]
    markers = {
        **target.markers,
        "os_name": "posix",
        "python_version": f"{major}.{minor}",
        "python_full_version": f"{major}.{minor}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    spec = f"{wheel}[{target.extra}]" if target.extra else str(wheel)
    args = ["install", "--dry-run", "--ignore-installed", "--only-binary=:all:"]
    for platform in target.platforms:
        args += ["--platform", platform]
    args += ["--python-version", python, "--implementation", "cp"]
    args += ["--target", str(work / "target"), "--report", str(report), spec]
    args += ["--find-links", str(work / "sdist_wheels")]
    if target.constraints:
        args += ["-c", str(ROOT / target.constraints)]
    cmd = [sys.executable, "-c", RUNNER, json.dumps(markers), *args]
    while True:
        report.unlink(missing_ok=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode == 0 and report.exists():
            break
        text = done.stderr + done.stdout
        missing = _sdist_only(text)
        if not missing or not all(
            _build_pure_wheel(name, work / "sdist_wheels", env) for name in missing
        ):
            return False, {}, _explain(text)
    installed = json.loads(report.read_text())["install"]
    versions = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
                for i in installed}  # fmt: skip
    return True, versions, ""


BUILT: set[str] = set()  # sdist-only dependencies built as pure-Python wheels here


def _sdist_only(pip_output: str) -> list[str]:
    """Packages pip found no wheel of ("no matching distributions available"), not yet built."""
    names, listing = [], False
    for line in pip_output.splitlines():
        if "have no matching distributions available" in line:
            listing = True
        elif listing and line.startswith("    ") and line.strip():
            names.append(line.strip())
        elif listing:
            listing = False
    if not names:
        for line in pip_output.splitlines():  # a top-level "No matching distribution found for X"
            if "No matching distribution found for" in line:
                names.append(line.rsplit(" ", 1)[-1])
    return [n for n in names if n.lower() not in BUILT]


def _build_pure_wheel(name: str, out: pathlib.Path, env: dict[str, str]) -> bool:
    """Builds `name` from its sdist; keeps it only if the wheel is pure Python."""
    out.mkdir(exist_ok=True)
    tmp = out / "_new"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-binary", name, "-q"]
    done = subprocess.run([*cmd, "-w", str(tmp), name], env=env, capture_output=True, text=True)
    wheels = list(tmp.glob("*.whl")) if done.returncode == 0 else []
    ok = bool(wheels) and all(w.name.endswith("-py3-none-any.whl") for w in wheels)
    for w in wheels:
        if ok:
            w.rename(out / w.name)
        else:
            w.unlink()
    if ok:
        BUILT.add(name.lower())
    return ok


def _explain(pip_output: str) -> str:
    """The useful part of a failed resolution: pip's conflict explanation, or its last errors."""
    lines = [
        ln
        for ln in pip_output.splitlines()
        if ln.strip() and "is ignored: it is neither a file nor a directory" not in ln
    ]
    for i, line in enumerate(lines):
        if line.startswith("The conflict is caused by"):
            return "\n".join(lines[i : i + 12])
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return "\n".join((errors or lines)[-8:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help=f"targets: {[t.name for t in TARGETS]}")
    parser.add_argument("--python-version", default="3.11")
    parser.add_argument(
        "--ignore-pip-config",
        action="store_true",
        help="resolve against the index alone: skip pip config files and PIP_* variables "
        "(local mirrors, find-links, machine-wide constraints); keeps PIP_INDEX_URL, PIP_CERT",
    )
    args = parser.parse_args()
    targets = [t for t in TARGETS if not args.only or t.name in args.only]
    env = pip_env(args.ignore_pip_config)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="check_install_") as tmp:
        work = pathlib.Path(tmp)
        wheel = build_wheel(work / "wheel", env)
        print(f"{wheel.name}, Python {args.python_version}, pip --dry-run per target\n")
        for t in targets:
            ok, versions, error = resolve(t, wheel, args.python_version, env, work)
            failed += not ok
            extra = f"[{t.extra}]" if t.extra else "(no extra)"
            flags = f" -c {t.constraints}" if t.constraints else ""
            print(f"{'OK  ' if ok else 'FAIL'} {t.name:<14} {extra:<11}{flags}  ({t.note})")
            print(f"     platform {t.platforms[0]}{' ...' if len(t.platforms) > 1 else ''}")
            if ok:
                shown = [f"{n}=={versions[n]}" for n in SHOWN if n in versions]
                tf = [n for n in ("tensorflow", "tensorflow-cpu") if n in versions]
                print(f"     {' '.join(shown)}")
                print(f"     {len(versions)} distributions; TensorFlow: {', '.join(tf) or 'none'}")
            else:
                print("     " + error.replace("\n", "\n     "))
    if BUILT:
        print(f"\nbuilt from source as pure-Python wheels (no wheel on the index): {sorted(BUILT)}")
    print(f"\n{len(targets) - failed}/{len(targets)} targets resolve")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
