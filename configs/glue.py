r"""GLUE: a pre-trained BERT fine-tuned on one task of the benchmark (`python -m bert_flax.glue`
runs several over a learning-rate grid and prints the GLUE table).

  python -m bert_flax.train --config=configs/glue.py:rte --workdir=workdir/glue/rte \
      --config.data.glue_dir=glue_data       # the GLUE download: glue_data/RTE/train.tsv ...
  # or TFDS glue/rte prepared under DIR, or the Hugging Face export's files:
  #   --config.data.dataset=tfds --config.data.tfds_data_dir=DIR
  #   --config.data.files=train=train.parquet,validation=validation.parquet,test=test.parquet
  # BERT-base from a checkpoint (a Hugging Face folder, read as it is), on a TPU or GPU:
  python -m bert_flax.train --config=configs/glue.py:mnli,base --workdir=workdir/glue/mnli \
      --config.data.glue_dir=glue_data --config.init_from=/ckpt/bert-base-uncased \
      --config.schedule.learning_rate=3e-5

The argument is a task of `bert_flax.tasks.glue.GLUE` (cola, sst2, mrpc, stsb, qqp, mnli, qnli,
rte, wnli; ax is predicted by MNLI's model), then optionally a size: `cpu` (the tiny BERT, the
default) or `base`. BERT's recipe (configs/finetune_sentiment.py): 128 tokens, batch 32, 3 epochs,
AdamW with 10% warm-up, a learning rate of 2e-5 .. 5e-5 for BERT-base; every evaluation scores
the task's official metrics on its dev set(s) (MNLI: matched and mismatched) and the best, by the
first, is kept; the test splits are then predicted into the GLUE server's submission files.
"""

import ml_collections

from bert_flax.tasks.glue.table import GLUE
from configs import default, finetune_sentiment

SIZES = ("cpu", "base")


def get_config(arg: str = "rte") -> ml_collections.ConfigDict:
    key, _, size = arg.partition(",")
    size = size or "cpu"
    if key not in GLUE or key == "ax":
        raise ValueError(f"Unknown GLUE task {key!r}; choose one of {sorted(set(GLUE) - {'ax'})}.")
    if size not in SIZES:
        raise ValueError(f"Unknown size {size!r}; choose one of {SIZES}.")
    spec = GLUE[key]
    config = finetune_sentiment.get_config()
    config.task = "glue"
    config.glue.task = key
    # Where the task is (the first set): data.glue_dir, the GLUE download's folder; data.files,
    # the Hugging Face export's (split=path,...); or data.dataset="tfds", TFDS glue/<task>.
    config.data.dataset = ""
    config.eval.split = ",".join(spec.eval_splits)
    config.eval.metrics = ",".join(spec.metrics)
    if size == "base":
        config.model.preset = "base"
        config.schedule.learning_rate = 2e-5
        config.train.dtype = "bfloat16"
        default.for_accelerators(config)
    return config
