r"""The full config schema with defaults; every other config starts from it.

  python -m bert_flax.train --config=configs/default.py --workdir=/tmp/bert_default \
      --config.data.data_dir=/path/to/prepared

Fields (see docs/training.md for the whole story):
  model:      `preset` of `bert_flax.model.config.BertConfig.preset` and every BertConfig field
              (None: the preset's value), e.g. --config.model.num_layers=2; `block_sparse.enabled`.
  data:       a directory prepared by `bert_flax.data.create_pretraining_data` (or `synthetic`).
  optimizer:  `name` picks one of `optim.OPTIMIZERS`; a section per optimizer holds all of its
              hyper-parameters, e.g. --config.optimizer.shampoo.block_size=256 (the learning
              rate comes from `schedule`, shared by all).
  schedule:   linear warm-up then polynomial decay to `end_learning_rate`.
  train:      global rows per optimizer step, steps, micro-batches, clipping, compute dtype, and
              how to adapt hyper-parameters to packing.
  mesh:       device mesh axes and shape (-1 = all remaining devices), partitioning rules.
  distributed: `jax.distributed.initialize()` for multi-host jobs.
  checkpoint, eval, log: intervals.
"""

import ml_collections
from ml_collections.config_dict import placeholder

import optim
from bert_flax import sharding
from bert_flax.model.config import config_section


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    # Starting parameters when the workdir has no checkpoint: a Hugging Face directory, a Google
    # BERT checkpoint, a bert_flax directory (bert_flax.convert --out) or another run's workdir
    # (its latest checkpoint, or step init_from_step). Parameters only; shapes must match.
    config.init_from = ""
    config.init_from_step = placeholder(int)

    # Every BertConfig field but `dtype` (from train.dtype); None = the preset's value.
    config.model = config_section("tiny")

    config.data = ml_collections.ConfigDict()
    config.data.data_dir = ""  # output_dir of create_pretraining_data
    config.data.synthetic = False  # random packed batches (benchmarks, profiling); no data_dir
    config.data.max_seq_length = 128
    config.data.packed = True  # False: the padded baseline (one sequence per row)
    config.data.max_sequences_per_pack = 3
    # Packing algorithm (packing.ALGORITHMS) that solves strategies.json when it is missing.
    config.data.algorithm = "nnlshp"
    config.data.max_predictions_per_seq = 20
    config.data.train_split = "train"
    config.data.eval_split = "validation"
    config.data.shuffle = True

    # LAMB, AdamW: b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 (BERT's) by default.
    config.optimizer = optim.config_section("lamb")

    config.schedule = ml_collections.ConfigDict()
    config.schedule.learning_rate = 1e-3  # peak
    config.schedule.warmup_steps = 100
    config.schedule.decay_power = 1.0  # 1.0 = linear decay (BERT)
    config.schedule.end_learning_rate = 0.0
    config.schedule.total_steps = 0  # steps the decay spans; 0 = train.steps - step_offset
    config.schedule.step_offset = 0  # the schedule starts at this step (phase 2 restarts it)

    config.train = ml_collections.ConfigDict()
    config.train.batch_size = 32  # global rows per optimizer step (all micro-batches, all hosts)
    config.train.steps = 1000
    config.train.max_minutes = 0.0  # > 0: stop (evaluate, save) once training took this long
    config.train.accumulation = 1  # micro-batches per optimizer step (lax.scan)
    config.train.grad_clip_norm = 1.0  # 0 disables clipping
    # A step whose loss or gradient is not finite is skipped (not applied); this many in a row
    # stop the run with an error naming the last finite checkpoint.
    config.train.max_nonfinite_steps = 5
    config.train.dtype = "float32"  # compute dtype: "float32" or "bfloat16" (params stay float32)
    config.train.mlm_normalization = "per_sequence"
    # The generator of the dropout masks' random bits: "threefry" (jax's default; the same masks
    # on any mesh and device count), "rbg" or "unsafe_rbg" (XLA's RngBitGenerator: cheaper bits,
    # but the masks depend on the sharding, so a run is reproducible only on the same mesh;
    # unsafe_rbg also derives keys with a weaker fold-in). docs/profile.md, "Dropout's bits".
    config.train.prng_impl = "threefry"
    # How to adapt to the packing factor p of the strategies (Krell et al., 2021):
    #   "none":                  keep everything;
    #   "divide_accumulation":   accumulation /= p, so each step sees as many sequences as unpacked;
    #                            but at least min_rows_per_step rows (r times the sequences, then
    #                            betas ** r and the learning rate * sqrt(r): Adam's scaling rule);
    #   "raise_betas":           keep the batch (p times more sequences) and use b1**p, b2**p.
    config.train.packing_hparams = "none"
    config.train.min_rows_per_step = 1

    config.mesh = ml_collections.ConfigDict()
    config.mesh.axes = ("data", "fsdp", "model")
    config.mesh.shape = (-1, 1, 1)
    # Logical axis -> mesh axes (t5x's rule table; default: `bert_flax.sharding`'s): e.g.
    # --config.mesh.rules.embed="()" replicates the embed dim instead of sharding it over fsdp.
    config.mesh.rules = sharding.rules_config()

    config.distributed = ml_collections.ConfigDict()
    config.distributed.initialize = False  # call jax.distributed.initialize() at start
    config.distributed.coordinator_address = ""  # "" = auto-detect (TPU pods, SLURM, ...)
    config.distributed.num_processes = 0  # 0 = auto-detect
    config.distributed.process_id = -1  # -1 = auto-detect

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every_steps = 500
    config.checkpoint.keep = 3
    config.checkpoint.enabled = True
    # Also keep the parameters of the best evaluation so far (by the task's metric) in
    # workdir/best, a bert_flax checkpoint directory (fine-tuning turns this on).
    config.checkpoint.keep_best = False
    # After SIGTERM the loop saves and stops at the next step or eval batch; if it cannot get
    # there within this long (a compilation), the process exits keeping the last checkpoint.
    config.checkpoint.preemption_grace_seconds = 8.0

    config.eval = ml_collections.ConfigDict()
    config.eval.every_steps = 500
    config.eval.num_batches = 20  # 0 = the whole split once
    config.eval.batch_size = 32
    config.eval.max_minutes = 0.0  # > 0: stop an evaluation (keeping what it did) after this long
    config.eval.padded = False  # evaluate on padded rows even when training packed
    # > 0: stop (save) at the first evaluation whose eval metric (the task's: masked_lm_accuracy,
    # accuracy) reaches this; `final["target_reached"]` says whether it did (time to accuracy).
    config.eval.stop_at = 0.0

    config.log = ml_collections.ConfigDict()
    config.log.every_steps = 20
    config.log.plots = True
    return config


def for_finetuning(config: ml_collections.ConfigDict) -> None:
    """BERT's fine-tuning recipe, for every task trained in epochs (`configs/finetune_sentiment.py`,
    `squad.py`): AdamW, linear warm-up over 10% of the steps then decay to 0, 32 sequences a
    step as the padded recipe (packed: `divide_accumulation`, at least 8 rows), evaluation every
    epoch on the validation split with the best parameters kept."""
    config.optimizer.name = "adamw"
    config.schedule.warmup_fraction = 0.1  # of train.steps (resolve_epochs sets warmup_steps)
    config.schedule.end_learning_rate = 0.0
    config.train.steps = 1  # set from epochs by bert_flax.finetune.resolve_epochs
    config.train.min_steps = 0  # steps at least, however few the examples (small samples)
    config.train.batch_size = 32  # sequences of the padded recipe; rows when packed: 32 / p
    config.train.packing_hparams = "divide_accumulation"
    config.train.min_rows_per_step = 8
    config.checkpoint.keep = 1
    config.checkpoint.keep_best = True
    config.eval.split = "validation"
    config.eval.batch_size = 32
    config.eval.evaluations = 0  # > 0: this many over the run (the best kept), not one an epoch
    config.log.every_steps = 20


# The sequence length from which the accelerator configs use the platform's flash kernel.
FLASH_ATTENTION_FROM = 512


def for_accelerators(config: ml_collections.ConfigDict) -> None:
    """The BERT presets' model settings for TPUs and GPUs (`configs/bert_base.py`,
    `bert_large.py`): the compile table's best predicted step (docs/compile.md, "Naming the
    traffic").

    - The identical layers as one scan (one layer's compile; the optimizer steps layer by
      layer), saving only the matrix products' outputs for the backward pass (LayerNorm, GELU
      and dropout recomputed).
    - From FLASH_ATTENTION_FROM tokens, `attention_impl="auto"`: the platform the program is
      built for picks the flash kernel over segments (no [rows, heads, length, length] scores or
      mask in HBM): splash on TPU, `pallas_gpu` (Triton) on GPU, XLA attention on CPU. None of
      them has attention-probability dropout, so it is off: MosaicBERT and Cramming pre-train
      without it, and on the CPU recipe it learns as well without
      (benchmarks/studies/attention_dropout.py). Shorter rows keep the preset's XLA attention
      with BERT's dropout: their scores are a quarter of 512's a token.
    """
    config.model.scan_layers = True
    config.model.remat_policy = "dots"
    if config.data.max_seq_length >= FLASH_ATTENTION_FROM:
        config.model.attention_impl = "auto"
        config.model.attention_dropout_rate = 0.0
