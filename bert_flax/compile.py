r"""Will this config fit, and how fast could it be? Compiles a run for an accelerator, on any host.

  python -m bert_flax.compile --config=configs/bert_base.py:phase2 --target=v5e-8
  python -m bert_flax.compile --config=configs/bert_large.py:phase2 --target=v5p-8 \
      --packing_factor=corpus_like --largest_batch --json=/tmp/large_v5p.json
  python -m bert_flax.compile --config=configs/tiny.py --target=h100    # needs jax's CUDA plugin

The train and eval steps are compiled exactly as a run builds them (`--config.FIELD=VALUE` as for
`bert_flax.main`), for compile-only devices of `--target` (`bert_flax.targets.TARGETS`), from
abstract shapes: no accelerator, parameter or batch is needed. Without
`--config.data.data_dir` the rows are synthetic, of the config's shapes. The report gives HBM per
device against the chip's, FLOPs, the collectives in the program, and a roofline step time with
the sequences per second it implies (a prediction: `bert_flax.aot`). `--largest_batch` bisects
over compiles for the most rows per step that fit. A user error ends as one line, exit status 2.
"""

from __future__ import annotations

import json
import sys

import ml_collections
from absl import app, flags
from ml_collections import config_flags

import packing
from bert_flax import aot, cli, overrides, targets

config_flags.DEFINE_config_file("config", None, "Config file (e.g. configs/bert_base.py:phase2).")
_TARGET = flags.DEFINE_string("target", "v5e-8", f"One of {sorted(targets.TARGETS)}.")
_PACKING_FACTOR = flags.DEFINE_string(
    "packing_factor",
    "",
    "Sequences per row to adapt the batch to and report sequences/s by: empty for the task's "
    "data, a number, or 'corpus_like' (NNLSHP on packing.synthetic.corpus_like_histogram, the "
    "figures of a real Wikipedia histogram, at the config's length and depth).",
)
_LARGEST_BATCH = flags.DEFINE_bool(
    "largest_batch", False, "Bisect over compiles for the most rows per step that fit."
)
_JSON = flags.DEFINE_string("json", None, "Also write the report as JSON here.")
flags.mark_flags_as_required(["config"])

GIB = 2**30


def packing_factor(config: ml_collections.ConfigDict, spec: str) -> float | None:
    """The `--packing_factor` flag's value for `config` (None: the task's own)."""
    if not spec:
        return None
    if not config.data.packed:
        return 1.0
    if spec == "corpus_like":
        length = config.data.max_seq_length
        hist = packing.synthetic.corpus_like_histogram(1_000_000, length)
        depth = config.data.max_sequences_per_pack
        return packing.pack_histogram(hist, length, "nnlshp", depth).metrics().packing_factor
    try:
        return float(spec)
    except ValueError:
        raise ValueError(
            f"--packing_factor={spec!r}: give a number >= 1, 'corpus_like' or nothing."
        ) from None


def format_report(r: aot.Report, largest: int | None = None) -> str:
    """The report as a person reads it (every time a roofline prediction)."""
    m = r.model
    t, e = r.train_memory, r.eval_memory
    over = max(t.total, e.total) - r.hbm_bytes
    verdict = "fits" if r.fits else f"does NOT fit (by {over / GIB:.2f} GiB)"
    lines = [
        f"{m['layers']}-layer, hidden {m['hidden']}, {m['parameters'] / 1e6:.1f}M parameters, "
        f"length {m['length']}, {'packed' if m['packed'] else 'padded'} "
        f"(factor {r.packing_factor:.3f}), {m['optimizer']}, attention={m['attention']}, "
        f"{m['dtype']}",
        f"on {r.target}: {r.devices} devices, mesh {r.mesh}; {r.rows_per_step} rows a step in "
        f"{r.accumulation} micro-batch(es)",
        f"compile: train {r.compile_s['train']:.1f} s, eval {r.compile_s['eval']:.1f} s "
        f"(tracing {r.compile_s['trace']:.1f} s)",
        "",
        f"HBM per device ({r.hbm_bytes / GIB:.1f} GiB): train step {t.total / GIB:.2f} GiB "
        f"(arguments {t.arguments / GIB:.2f}, outputs {t.outputs / GIB:.2f}, in place "
        f"{t.aliased / GIB:.2f}, temporaries {t.temporaries / GIB:.2f}, code "
        f"{t.code / GIB:.3f}); eval step {e.total / GIB:.2f} GiB: {verdict}",
        f"  parameters {r.param_bytes / GIB:.3f} GiB, optimizer state "
        f"{r.optimizer_bytes / GIB:.3f} GiB per device",
        f"FLOPs per device per step: XLA {_num(r.xla_flops)}, counted {_num(r.hlo_flops)}; "
        f"model FLOPs per step (all devices) {_num(r.model_flops_per_step)}",
        "collectives per device per step: "
        + (
            ", ".join(f"{c.kind} x{c.count} ({c.bytes / 2**20:.1f} MiB)" for c in r.collectives)
            or "none"
        ),
        "",
        "predicted (roofline, per device):",
    ]
    for name, c in sorted(r.classes.items(), key=lambda kv: -kv[1].seconds):
        lines.append(
            f"  {name:<18} {c.seconds * 1e3:9.3f} ms  {_num(c.flops)} FLOPs  {_num(c.bytes)} B"
        )
    lines.append(f"  {'collectives':<18} {r.collective_bytes / r.link_bytes_per_s * 1e3:9.3f} ms")
    lines.append(
        f"step {r.roofline_step_s * 1e3:.2f} ms -> {r.sequences_per_s:,.0f} sequences/s, "
        f"model FLOPs utilisation {r.model_flops_utilisation:.0%} (prediction)"
    )
    if largest is not None:
        lines.append(f"largest batch that fits: {largest} rows a step")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = flags.FLAGS.config
    if not config.data.data_dir:
        config.data.synthetic = True
    target = targets.target(_TARGET.value)
    factor = packing_factor(config, _PACKING_FACTOR.value)
    largest = None
    if _LARGEST_BATCH.value:
        largest, report = aot.largest_batch(config, target, factor)
        if report is None:
            raise ValueError(f"Not one row per data shard fits on {target.name}.")
    else:
        report = aot.compile_for(config, target, factor)
    print(format_report(report, largest))
    if _JSON.value:
        out = report.as_dict() | {"largest_batch": largest}
        with open(_JSON.value, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {_JSON.value}", file=sys.stderr)


if __name__ == "__main__":
    cli.run(main, flags_parser=overrides.flags_parser("config"))
