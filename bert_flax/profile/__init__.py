"""Where a training step spends its time: per operation class, with FLOPs, bytes and a roofline.

    from bert_flax import profile
    result = profile.profile_step(jitted_fn, *args, steps=3)
    print(profile.report.format_table(result))

CLI for a configured BERT training step: `python -m bert_flax.profile --config=configs/tiny.py`.
See docs/profile.md.
"""

from bert_flax.hlo.classify import CLASSES, LABELS, MATMUL_CLASSES, NON_MATMUL_CLASSES
from bert_flax.profile import ceilings, report, trace
from bert_flax.profile.ceilings import Ceilings
from bert_flax.profile.profiler import ClassStats, OpRecord, StepProfile, analyse, profile_step

__all__ = [
    "CLASSES",
    "LABELS",
    "MATMUL_CLASSES",
    "NON_MATMUL_CLASSES",
    "Ceilings",
    "ClassStats",
    "OpRecord",
    "StepProfile",
    "analyse",
    "ceilings",
    "profile_step",
    "report",
    "trace",
]
