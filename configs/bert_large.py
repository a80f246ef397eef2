r"""BERT-large with LAMB (You et al., 2020; NVIDIA DeepLearningExamples recipe), packed.

  python -m bert_flax.train --config=configs/bert_large.py:phase1 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_128
  python -m bert_flax.train --config=configs/bert_large.py:phase2 --workdir=$WORKDIR \
      --config.data.data_dir=$DATA_512

The recipe (`lamb_recipe`, BERT-base's too: configs/bert_base_lamb.py) is NVIDIA's
(PyTorch/LanguageModeling/BERT/scripts/configs/pretrain_config.sh), which the packing paper
(Krell et al., 2021, arXiv 2107.02027) pre-trains with. Phase 1: 65,536 sequences per step at
length 128, peak learning rate 6e-3, 2,000 warm-up steps (28.43% of 7,038). Phase 2: 32,768
sequences per step at length 512, peak 4e-3, 200 warm-up steps (12.8% of 1,563). LAMB b1 0.9,
b2 0.999, eps 1e-6, weight decay 0.01, polynomial decay of power 0.5. The schedule restarts for
phase 2 (`schedule.step_offset`).

Packing (Krell et al.): rows hold about p sequences (p ~ 1.2 at 128 and ~ 2.0 at 512 on
Wikipedia). As in the paper, a step keeps the recipe's rows (p times the sequences) and LAMB's
betas are raised to the power p (`packing_hparams="raise_betas"`: b1**p, b2**p, so the moments
average over as many sequences as unpacked); `--config.train.packing_hparams=divide_accumulation`
keeps the sequences per step instead (p times fewer rows), hence the unpacked run's trajectory.
`accumulation` sets the micro-batch (batch_size / accumulation rows); fit it to your accelerators.
"""

import ml_collections

from configs import default

PHASES = {
    # name: (max_seq_length, max_predictions, batch, lr, warmup, phase steps, accumulation)
    "phase1": (128, 20, 65_536, 6e-3, 2_000, 7_038, 128),
    "phase2": (512, 80, 32_768, 4e-3, 200, 1_563, 256),
}


def lamb_recipe(preset: str, phase: str) -> ml_collections.ConfigDict:
    """BERT `preset` ("base", "large") packed, by the LAMB recipe's `phase` (module doc)."""
    if phase not in PHASES:
        raise ValueError(f"Unknown phase {phase!r}; choose one of {sorted(PHASES)}.")
    max_seq_length, max_predictions, batch, lr, warmup, steps, accumulation = PHASES[phase]
    step_offset = 0 if phase == "phase1" else PHASES["phase1"][5]
    config = default.get_config()
    config.model.preset = preset
    config.data.max_seq_length = max_seq_length
    config.data.max_predictions_per_seq = max_predictions
    config.data.packed = True
    config.data.max_sequences_per_pack = 3
    default.for_accelerators(config)

    config.optimizer.name = "lamb"
    config.optimizer.lamb.update(b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01)
    config.schedule.learning_rate = lr
    config.schedule.warmup_steps = warmup
    config.schedule.decay_power = 0.5
    config.schedule.total_steps = steps
    config.schedule.step_offset = step_offset

    config.train.batch_size = batch
    config.train.accumulation = accumulation
    config.train.steps = step_offset + steps
    config.train.packing_hparams = "raise_betas"
    config.train.dtype = "bfloat16"

    config.checkpoint.every_steps = 200
    config.eval.every_steps = 1_000
    config.eval.num_batches = 100
    config.eval.batch_size = 512
    config.log.every_steps = 10
    return config


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    return lamb_recipe("large", phase)
