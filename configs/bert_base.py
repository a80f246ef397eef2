r"""BERT-base, the original recipe (Devlin et al., 2019), packed.

Phase 1 (90% of the steps at sequence length 128), then phase 2 (10% at 512), restarting from the
phase-1 checkpoint (the workdir is reused, so the run resumes and continues):

  python -m bert_flax.train --config=configs/bert_base.py:phase1 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_128
  python -m bert_flax.train --config=configs/bert_base.py:phase2 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_512

Original settings: Adam with decoupled weight decay 0.01, b1 0.9, b2 0.999, peak learning rate
1e-4 with 10,000 warm-up steps and linear decay, 256 sequences per step, 1M steps in total.
Packed, each row holds about p sequences; `divide_accumulation` keeps 256 sequences per step.
"""

import ml_collections

from configs import default

PHASES = {
    # name: (max_seq_length, max_predictions_per_seq, steps at the end of the phase)
    "phase1": (128, 20, 900_000),
    "phase2": (512, 80, 1_000_000),
}


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    if phase not in PHASES:
        raise ValueError(f"Unknown phase {phase!r}; choose one of {sorted(PHASES)}.")
    max_seq_length, max_predictions, steps = PHASES[phase]
    config = default.get_config()
    config.model.preset = "base"
    config.data.max_seq_length = max_seq_length
    config.data.max_predictions_per_seq = max_predictions
    config.data.packed = True
    config.data.max_sequences_per_pack = 3
    default.for_accelerators(config)

    config.optimizer.name = "adamw"
    config.optimizer.adamw.update(b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01)
    config.schedule.learning_rate = 1e-4
    config.schedule.warmup_steps = 10_000
    config.schedule.decay_power = 1.0
    # The step counter continues across phases, so the schedule spans the whole run.
    config.schedule.total_steps = PHASES["phase2"][2]

    config.train.batch_size = 256
    config.train.accumulation = 1
    config.train.steps = steps
    config.train.packing_hparams = "divide_accumulation"
    config.train.dtype = "bfloat16"

    config.checkpoint.every_steps = 10_000
    config.eval.every_steps = 10_000
    config.eval.num_batches = 100
    config.eval.batch_size = 256
    config.log.every_steps = 100
    return config
