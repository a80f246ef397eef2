r"""The config schema: every field any task or command reads, with its default; every other
config starts from it and only sets values (the config is locked: a field it lacks is an error).

  python -m bert_flax.train --config=configs/default.py --workdir=/tmp/bert_default \
      --config.data.data_dir=/path/to/prepared

Fields (see docs/training.md for the whole story):
  task:       what the run trains (`bert_flax.tasks.TASKS`; `python -m bert_flax.train` runs any).
  model:      `preset` of `bert_flax.model.config.BertConfig.preset` and every BertConfig field
              (None: the preset's value), e.g. --config.model.num_layers=2; `block_sparse.enabled`.
  data:       the rows; pre-training's directory prepared by
              `bert_flax.data.create_pretraining_data` (or `synthetic`); a fine-tuning task's
              labelled files or bundled set.
  optimizer:  `name` picks one of `optim.OPTIMIZERS`; a section per optimizer holds all of its
              hyper-parameters, e.g. --config.optimizer.shampoo.block_size=256 (the learning
              rate comes from `schedule`, shared by all).
  schedule:   linear warm-up then polynomial decay to `end_learning_rate`.
  train:      global rows per optimizer step, steps, micro-batches, clipping, compute dtype, and
              how to adapt hyper-parameters to packing.
  mesh:       device mesh axes and shape (-1 = all remaining devices), partitioning rules.
  distributed: `jax.distributed.initialize()` for multi-host jobs.
  checkpoint, eval, log: intervals; eval also the split and, for a classifier, its metrics.
  classifier, glue, squad, token_classification: a fine-tuning task's own settings.
Steps, warm-up and intervals derived from the data (`train.epochs`, `schedule.warmup_fraction`,
`eval.evaluations`) are computed by the run (`bert_flax.train.setup.RunLength`), never written
back here.
"""

import ml_collections
from ml_collections.config_dict import placeholder

import optim
from bert_flax import sharding
from bert_flax.model.config import config_section


def get_config() -> ml_collections.ConfigDict:
    """Every field any task or command reads, with its default; locked, so a field the schema
    lacks is an error wherever it is set (a task config sets values only)."""
    config = ml_collections.ConfigDict()
    config.task = "pretraining"  # what the run trains: a name of bert_flax.tasks.TASKS
    config.seed = 0
    # Starting parameters when the workdir has no checkpoint: a Hugging Face directory, a Google
    # BERT checkpoint, a bert_flax directory (bert_flax.convert --out) or another run's workdir
    # (its latest checkpoint, or step init_from_step). Parameters only; shapes must match.
    config.init_from = ""
    config.init_from_step = placeholder(int)

    # Every BertConfig field but `dtype` (from train.dtype); None = the preset's value.
    config.model = config_section("tiny")

    config.data = data_section()

    # LAMB, AdamW: b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 (BERT's) by default.
    config.optimizer = optim.config_section("lamb")

    config.schedule = ml_collections.ConfigDict()
    config.schedule.learning_rate = 1e-3  # peak
    config.schedule.warmup_steps = 100
    # > 0: warm up over this fraction of the run's steps instead of warmup_steps.
    config.schedule.warmup_fraction = 0.0
    config.schedule.decay_power = 1.0  # 1.0 = linear decay (BERT)
    config.schedule.end_learning_rate = 0.0
    config.schedule.total_steps = 0  # steps the decay spans; 0 = the run's steps - step_offset
    config.schedule.step_offset = 0  # the schedule starts at this step (phase 2 restarts it)

    config.train = ml_collections.ConfigDict()
    config.train.batch_size = 32  # global rows per optimizer step (all micro-batches, all hosts)
    config.train.steps = 1000  # the run's length, unless train.epochs is set
    # > 0: train this many epochs of a fine-tuning task's training rows (the run's steps, after
    # the packing adjustment; at least min_steps) instead of train.steps.
    config.train.epochs = 0.0
    config.train.min_steps = 0
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
    config.checkpoint.every_steps = 500  # 0: at every evaluation
    config.checkpoint.keep = 3
    config.checkpoint.enabled = True
    # Also keep the parameters of the best evaluation so far (by the task's metric) in
    # workdir/best, a bert_flax checkpoint directory (fine-tuning turns this on).
    config.checkpoint.keep_best = False
    # After SIGTERM the loop saves and stops at the next step or eval batch; if it cannot get
    # there within this long (a compilation), the process exits keeping the last checkpoint.
    config.checkpoint.preemption_grace_seconds = 8.0

    config.eval = ml_collections.ConfigDict()
    # The split(s) each evaluation runs over; several, comma-separated, for a fine-tuning task
    # (MNLI's validation_matched,validation_mismatched: the first judges the run).
    config.eval.split = "validation"
    config.eval.every_steps = 500  # unless train.epochs (one an epoch) or evaluations is set
    config.eval.evaluations = 0  # > 0: this many evaluations evenly over the run
    config.eval.num_batches = 20  # pre-training: 0 = the whole split (fine-tuning: always whole)
    config.eval.batch_size = 32
    config.eval.max_minutes = 0.0  # > 0: stop an evaluation (keeping what it did) after this long
    config.eval.padded = False  # evaluate on padded rows even when training packed
    # > 0: stop (save) at the first evaluation whose eval metric (the task's: masked_lm_accuracy,
    # accuracy) reaches this; `final["target_reached"]` says whether it did (time to accuracy).
    config.eval.stop_at = 0.0
    # Classification: what each evaluation reports, computed over the whole validation split
    # (bert_flax.tasks.classification.metrics: accuracy, f1, mcc, pearson, spearman, mse),
    # comma-separated; "": accuracy, or mse,pearson,spearman for regression. The best parameters
    # are those of `metric` ("": the first).
    config.eval.metrics = ""
    config.eval.metric = ""

    config.log = ml_collections.ConfigDict()
    config.log.every_steps = 20
    config.log.plots = True

    # Each fine-tuning task's own settings (configs/finetune_sentiment.py, glue.py, squad.py,
    # conll.py).
    # What the classifier reads of each example: "cls" (BERT's [CLS] state) or "mean" (the mean
    # of its states: better from a model pre-trained for minutes; docs/finetuning.md). With
    # rescale_embeddings, a pre-training checkpoint's embedding tables are scaled down to a fresh
    # initialisation's size (`bert_flax.model.bert.rescale_embeddings`); off: BERT's recipe.
    config.classifier = ml_collections.ConfigDict({"pooling": "cls", "rescale_embeddings": False})
    config.glue = ml_collections.ConfigDict({"task": ""})  # a key of tasks.glue.GLUE
    # Answers: of at most max_answer_length tokens, from the n_best starts and ends.
    config.squad = ml_collections.ConfigDict({"n_best": 20, "max_answer_length": 30})
    # How entities are read off tags for the scores: "conlleval" (lenient: as the conlleval
    # script that CoNLL-2003 results are reported with, and seqeval's default mode) or "strict"
    # (the scheme's rules, seqeval's mode="strict").
    config.token_classification = ml_collections.ConfigDict({"entity_mode": "conlleval"})

    config.lock()
    return config


def data_section() -> ml_collections.ConfigDict:
    """`config.data`: the rows (every task), pre-training's prepared data, and the fine-tuning
    tasks' labelled data."""
    data = ml_collections.ConfigDict()
    # Rows, every task.
    data.max_seq_length = 128
    data.packed = True  # False: the padded baseline (one sequence per row)
    data.max_sequences_per_pack = 3
    # Packing algorithm (packing.ALGORITHMS): pre-training's when strategies.json is missing, a
    # fine-tuning task's for its rows.
    data.algorithm = "nnlshp"
    data.shuffle = True

    # Pre-training.
    data.data_dir = ""  # output_dir of create_pretraining_data
    data.synthetic = False  # random packed batches (benchmarks, profiling); no data_dir
    data.max_predictions_per_seq = 20
    data.train_split = "train"  # (the evaluation's: eval.split)

    # Fine-tuning: where the examples are. The first set of: files (train_file ...; GLUE:
    # glue_dir or files), else `dataset`: the task's bundled set (its config names it), or "tfds".
    data.dataset = ""
    data.train_file = ""  # CSV/TSV/JSONL (classification), SQuAD JSON, CoNLL files
    data.validation_file = ""  # "": classification splits train_file (split_seed, 0.8/0.1/0.1)
    data.test_file = ""  # optional: predicted after training
    data.glue_dir = ""  # GLUE: the download's folder (glue_data/RTE/train.tsv ...)
    data.files = ""  # GLUE: split=path,... of the Hugging Face export (CSV, TSV, JSONL, Parquet)
    # dataset="tfds": the builder (GLUE: glue/<glue.task>), its tag feature (token
    # classification: conll2003's ner, pos or chunks), and TFDS's data dir ("": its default).
    data.tfds_name = ""
    data.tfds_label = ""
    data.tfds_data_dir = ""
    data.split_seed = 0  # the random splits and samples of the bundled sets and files
    # > 0: train (evaluate) on this many examples (classification: a stratified sample drawn
    # with split_seed, a smaller one part of a larger; SQuAD, token classification: the first).
    data.train_examples = 0
    data.validation_examples = 0
    data.rule_sentences = 0  # token classification's rule set: > 0, at most this many a split
    # "": the vocabulary config.init_from was trained with (a run's prepared data's, or the
    # vocab.txt beside its weights), else bert-base-uncased's WordPiece vocabulary.
    data.vocab_file = ""
    # Lower-case the text (an uncased model) or not (a cased one); None: as config.init_from was
    # trained (its prepared data's summary, or do_lower_case in the tokenizer_config.json beside
    # its weights), else uncased unless the vocabulary is cased. Recorded in best/best.json.
    data.lowercase = placeholder(bool)

    # Fine-tuning: the labels.
    data.regression = False  # classification: float labels, one output, MSE
    # Multi-label: one `labels` column (a JSON list, or names joined by label_separator), or "":
    # one 0/1 column per label, named here ("toxic,obscene").
    data.label_columns = ""
    data.label_separator = ","
    # Token classification: the label's column in the CoNLL files (-1: the last; 0 is the word),
    # the files' scheme (IOB1, IOB2, BIOES or none for POS), a scheme to train and score in if
    # not the files' (""), and whether every sub-word of a word is labelled (else its first).
    data.label_column = -1
    data.label_scheme = "IOB2"
    data.convert_to = ""
    data.label_all_subwords = False

    # SQuAD: windows over long contexts, questions cut to max_query_length tokens.
    data.doc_stride = 128
    data.max_query_length = 64
    return data


def for_finetuning(config: ml_collections.ConfigDict) -> None:
    """BERT's fine-tuning recipe, for every task trained in epochs (`configs/finetune_sentiment.py`,
    `squad.py`): AdamW, linear warm-up over 10% of the steps then decay to 0, 32 sequences a
    step as the padded recipe (packed: `divide_accumulation`, at least 8 rows), evaluation every
    epoch on the validation split with the best parameters kept."""
    config.optimizer.name = "adamw"
    config.schedule.warmup_fraction = 0.1
    config.schedule.end_learning_rate = 0.0
    config.train.epochs = 3.0
    config.train.batch_size = 32  # sequences of the padded recipe; rows when packed: 32 / p
    config.train.packing_hparams = "divide_accumulation"
    config.train.min_rows_per_step = 8
    config.checkpoint.every_steps = 0  # at every evaluation
    config.checkpoint.keep = 1
    config.checkpoint.keep_best = True
    config.eval.batch_size = 32
    config.log.every_steps = 20


# The sequence length from which the accelerator configs use the platform's flash kernel.
FLASH_ATTENTION_FROM = 512


def for_accelerators(config: ml_collections.ConfigDict) -> None:
    """The BERT presets' model settings for TPUs and GPUs (`configs/bert_base.py`,
    `bert_large.py`): the compile table's best predicted step (docs/compile.md, "The GPU step").

    - The layers unrolled, with nothing recomputed for the backward pass: a scan stacks every
      saved activation into a [layers, ...] buffer and slices it out again (copies of all of
      them), and recomputing LayerNorm, GELU and dropout is a pass over the activations each.
      BERT-base at 512 keeps its activations well inside a v5e's HBM at the recipe's rows.
    - From FLASH_ATTENTION_FROM tokens, `attention_impl="auto"`: the platform the program is
      built for picks the flash kernel that skips the blocks a packed row's sequences never
      share (no [rows, heads, length, length] scores or mask in HBM): `packed_tpu` on TPU,
      `packed_gpu` on GPU, XLA attention on CPU. Attention-probability dropout is off, so the
      model is the same on every platform: MosaicBERT and Cramming pre-train without it, and
      on the CPU recipe it learns as well without (benchmarks/studies/attention_dropout.py).
      Shorter rows keep the preset's XLA attention with BERT's dropout: their scores are a
      quarter of 512's a token.
    """
    config.model.scan_layers = False
    config.model.remat_policy = "none"
    if config.data.max_seq_length >= FLASH_ATTENTION_FROM:
        config.model.attention_impl = "auto"
        config.model.attention_dropout_rate = 0.0
