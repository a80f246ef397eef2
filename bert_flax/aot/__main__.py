r"""Will this config fit, and how fast could it be? Compiles a run for an accelerator, on any host.

  python -m bert_flax.aot --config=configs/bert_base.py:phase2 --target=v5e-8
  python -m bert_flax.aot --config=configs/bert_large.py:phase2 --target=v5p-8 \
      --packing_factor=corpus_like --largest_batch --json=/tmp/large_v5p.json
  python -m bert_flax.aot --config=configs/tiny.py --target=h100    # jax's CUDA plugin: make venv

The train and eval steps are compiled exactly as a run builds them (`--config.FIELD=VALUE` as for
`bert_flax.train`), for compile-only devices of `--target` (`bert_flax.aot.targets.TARGETS`), from
abstract shapes: no accelerator, parameter or batch is needed. Without
`--config.data.data_dir` the rows are synthetic, of the config's shapes. The report gives HBM per
device against the chip's, FLOPs, the collectives in the program, and a roofline step time with
the sequences per second it implies (a prediction: `bert_flax.aot.roofline`). `--largest_batch`
bisects over compiles for the most rows per step that fit. A user error ends as one line, exit
status 2.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from bert_flax import errors
from bert_flax.aot import largest_batch, packings, roofline, targets
from bert_flax.train import overrides

config_flags.DEFINE_config_file("config", None, "Config file (e.g. configs/bert_base.py:phase2).")
_TARGET = flags.DEFINE_string("target", "v5e-8", f"One of {sorted(targets.TARGETS)}.")
_PACKING_FACTOR = flags.DEFINE_string(
    "packing_factor",
    "",
    "Sequences per row to adapt the batch to and report sequences/s by: empty for the task's "
    f"data, a number, or one of {sorted(packings.PACKINGS)}: the config's packer (data.algorithm, "
    "data.max_sequences_per_pack) on that length histogram at the config's length "
    "(bert_flax.aot.packings.PACKINGS: corpus_like, the figures of a real Wikipedia histogram at "
    "128 and 512; web_like, the bundled lognormal_web long-context histogram, 1,024-8,192). The "
    "block-skipping attention is charged the block pairs it visits in those rows.",
)
_LARGEST_BATCH = flags.DEFINE_bool(
    "largest_batch", False, "Bisect over compiles for the most rows per step that fit."
)
_JSON = flags.DEFINE_string("json", None, "Also write the report as JSON here.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = flags.FLAGS.config
    if config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/bert_base.py:phase2")
    if not config.data.data_dir:
        config.data.synthetic = True
    target = targets.target(_TARGET.value)
    devices = targets.compile_only_devices(target)  # before jax runs anything (the fraction)
    factor = packings.packing_factor(config, _PACKING_FACTOR.value)
    spec = _PACKING_FACTOR.value
    fractions = {
        "attention_visited_fraction": packings.attention_visited_fraction(config, spec),
        "attention_needed_fraction": packings.attention_needed_fraction(config, spec),
    }
    largest = None
    if _LARGEST_BATCH.value:
        largest, report = largest_batch.largest_batch(config, target, factor, **fractions)
        if report is None:
            raise ValueError(f"Not one row per data shard fits on {target.name}.")
    else:
        report = roofline.compile_for(config, target, factor, devices, **fractions)
    print(roofline.format_report(report, largest))
    if _JSON.value:
        out = report.as_dict() | {"largest_batch": largest}
        with open(_JSON.value, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {_JSON.value}", file=sys.stderr)


if __name__ == "__main__":
    errors.run(main, flags_parser=overrides.flags_parser("config"))
