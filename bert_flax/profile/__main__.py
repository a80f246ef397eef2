r"""Profile the configured BERT training step: time per operation class, with a roofline.

  python -m bert_flax.profile --config=configs/tiny.py --config.train.batch_size=8 \
      --steps=3 --plot=/tmp/tiny_profile.png
  python -m bert_flax.profile --config=configs/tiny.py --json
  python -m bert_flax.profile --config=configs/tiny.py \
      --sweep=seq_len=128,512 --sweep=dtype=float32,bfloat16 --plot=/tmp/sweep.png

Without `--config.data.data_dir` the step runs on synthetic batches of the configured shapes.
`--plot=FILE.png` writes the stacked-bar plot to FILE.png and the roofline to FILE_roofline.png.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from bert_flax import errors
from bert_flax.input_pipeline.contract import PreparedData
from bert_flax.profile import ceilings as ceilings_lib
from bert_flax.profile import configured, report

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.")
_STEPS = flags.DEFINE_integer("steps", 3, "Traced steps (after warm-up).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untraced steps first (compile, allocation).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON line per class plus a total line.")
_PLOT = flags.DEFINE_string("plot", None, "Write the stacked-bar plot here (and *_roofline.png).")
_SWEEP = flags.DEFINE_multi_string(
    "sweep",
    [],
    "key=v1,v2,...: profile every combination; key is a dotted config field or one of "
    f"{sorted(configured.SWEEP_ALIASES)}.",
)
_MARKDOWN = flags.DEFINE_bool("markdown", False, "Print tables as markdown.")
_LOGDIR = flags.DEFINE_string("trace_dir", None, "Keep the raw profiler traces here.")


def roofline_path(path: str) -> str:
    stem, dot, ext = path.rpartition(".")
    return f"{stem}_roofline.{ext}" if dot else f"{path}_roofline.png"


def main(argv):
    del argv
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/tiny.py")
    settings_list = configured.sweep_settings(configured.parse_sweeps(_SWEEP.value))
    configs = [configured.with_settings(_CONFIG.value, s) for s in settings_list]
    for config in configs:  # bad data ends the run before the first (slow) profile
        if config.data.data_dir:
            PreparedData.load(config.data.data_dir)
    measured: dict[str, ceilings_lib.Ceilings] = {}  # by matmul dtype, shared by the sweep
    profiles = []
    for i, (settings, config) in enumerate(zip(settings_list, configs, strict=True)):
        label = ",".join(f"{k}={v}" for k, v in settings.items()) or config.model.preset
        print(f"[{i + 1}/{len(settings_list)}] profiling {label} ...", file=sys.stderr, flush=True)
        result = configured.profile_config(
            config,
            steps=_STEPS.value,
            warmup=_WARMUP.value,
            label=label,
            ceilings=measured.get(str(config.train.dtype), True),
            logdir=_LOGDIR.value,
        )
        if result.ceilings is not None:
            measured[result.ceilings.matmul_dtype] = result.ceilings
        profiles.append(result)
        if _JSON.value:
            print("\n".join(report.json_lines(result)), flush=True)
        else:
            print(report.format_table(result, markdown=_MARKDOWN.value), end="\n\n", flush=True)
    if len(profiles) > 1 and not _JSON.value:
        print(report.format_sweep(profiles, markdown=_MARKDOWN.value))
    if _PLOT.value:
        report.plot_stacked(profiles, _PLOT.value)
        report.plot_roofline(profiles, roofline_path(_PLOT.value))
        print(f"wrote {_PLOT.value} and {roofline_path(_PLOT.value)}", file=sys.stderr)


if __name__ == "__main__":
    errors.run(main)
