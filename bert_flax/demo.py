r"""`make demo`: what packing buys, on CPU in a few minutes.

  python -m bert_flax.demo --workdir=workdir/demo [--steps=300] [--finetune_epochs=2]

1. Data: the bundled State of the Union speeches cut at paragraph boundaries (each paragraph a
   document, `--document_mode=blank_line`) as BERT examples of up to 256 tokens: most paragraphs
   are far shorter than a row, so padded rows are about 40% real tokens and NNLSHP packs
   about 2.4 sequences per row (`workdir/demo/sotu_paragraphs_256`).
2. Pre-training side by side: the tiny BERT packed (about 16 sequences in 7 rows per step,
   `divide_accumulation`) and padded (16 rows of one sequence) for the same steps, so both see
   about the same sequences; both are evaluated on the same padded held-out rows. Printed and
   plotted (`workdir/demo/packed_vs_padded.png`): sequences per second of each and their ratio,
   and eval masked-LM accuracy against sequences seen (the packing paper's claim: the curves
   coincide). The speed is timed after both runs, their train steps alternating (10 rounds of 3
   steps each, median), so that the load of a shared machine hits both alike.
3. Fine-tuning: the packed pre-trained model on the bundled sentiment set, packed
   (`configs/finetune_sentiment.py`), against the majority-class baseline.

Rerunning reuses the prepared data and resumes finished runs (delete the workdir to start over).
"""

from __future__ import annotations

import os
import time

from absl import app, flags, logging

from bert_flax import finetune, sharding, train
from bert_flax.data.contract import SUMMARY_FILE, PreparedData
from bert_flax.metrics import read_metrics, side_by_side
from bert_flax.train_setup import create_train_setup
from configs import finetune_sentiment, tiny

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "workdir/demo", "Where the prepared data and the runs go.")
flags.DEFINE_integer("steps", 300, "Pre-training steps of each run (packed and padded).")
flags.DEFINE_float("finetune_epochs", 2.0, "Fine-tuning epochs (0 skips fine-tuning).")
flags.DEFINE_integer("dupe_factor", 1, "Times each document is masked differently.")

MAX_SEQ_LENGTH = 256
LAYOUTS = ("packed", "padded")
SPEED_ROUNDS = 10  # side-by-side timing: rounds of 3 steps each


def prepare_data(
    data_dir: str, max_seq_length: int, dupe_factor: int, document_mode: str = "file"
) -> dict:
    """The bundled corpus as pre-training data in `data_dir` (reused when already there)."""
    if os.path.exists(os.path.join(data_dir, SUMMARY_FILE)):
        logging.info("Reusing prepared data in %s", data_dir)
        return PreparedData.load(data_dir).summary
    from bert_flax.data.create_pretraining_data import create_pretraining_data

    return create_pretraining_data(
        "sotu",
        data_dir,
        max_seq_length=max_seq_length,
        dupe_factor=dupe_factor,
        document_mode=document_mode,
    )


def pretraining_config(data_dir: str, packed: bool, steps: int):
    config = tiny.get_config()
    config.data.data_dir = data_dir
    config.data.max_seq_length = MAX_SEQ_LENGTH
    config.data.packed = packed
    config.train.packing_hparams = "divide_accumulation"  # ~16 sequences per step either way
    config.train.steps = steps
    config.schedule.warmup_steps = min(config.schedule.warmup_steps, steps // 4)
    config.eval.padded = True  # the same held-out rows for both
    config.eval.every_steps = max(steps // 4, 1)
    config.eval.batch_size = 64
    config.eval.num_batches = 8  # the same 512 held-out sequences for both
    config.checkpoint.every_steps = steps
    return config


def learning_curve(workdir: str) -> tuple[list[float], list[float]]:
    """(sequences seen, eval masked-LM accuracy) at each evaluation of a run."""
    records = read_metrics(workdir)
    seen = {r["step"]: r["sequences_seen"] for r in records["train"]}
    evals = [r for r in records["eval"] if r["step"] in seen]
    return [seen[r["step"]] for r in evals], [r["masked_lm_accuracy"] for r in evals]


def plot(runs: dict[str, dict], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for layout, run in runs.items():
        left.plot(*learning_curve(run["workdir"]), "o-", label=layout)
    baseline = runs["packed"]["final"]["baseline"]
    left.axhline(baseline, color="gray", ls=":", label="most frequent token")
    left.set(xlabel="sequences seen", ylabel="eval masked-LM accuracy", title="Learning")
    left.legend()
    left.grid(alpha=0.3)
    rates = [runs[k]["sequences_per_second"] for k in LAYOUTS]
    right.bar(LAYOUTS, rates, color=["tab:blue", "tab:orange"])
    right.set(ylabel="training sequences / s", title=f"Speed: {rates[0] / rates[1]:.2f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pretrain(workdir: str, data_dir: str, steps: int) -> dict[str, dict]:
    """Both runs; then their train steps timed side by side (alternating, so that the load of a
    shared machine hits both alike): `sequences_per_second`."""
    runs, setups, batches = {}, {}, {}
    for layout in LAYOUTS:
        config = pretraining_config(data_dir, layout == "packed", steps)
        run_dir = os.path.join(workdir, layout)
        runs[layout] = {"workdir": run_dir, "final": train.train_and_evaluate(config, run_dir)}
        setups[layout] = setup = create_train_setup(config)
        iterator = setup.task.train_batches(setup.batch_size, setup.model_config.vocab_size)
        batches[layout] = [sharding.global_batch(setup.mesh, next(iterator)) for _ in range(3)]
    timings = side_by_side(setups, batches, rounds=SPEED_ROUNDS, steps=3)
    for layout, timing in timings.items():
        runs[layout]["sequences_per_second"] = timing.sequences_per_second
    return runs


def summary_text(data: dict, runs: dict[str, dict], tuned: dict | None, seconds: float) -> str:
    strategies, train_split = data.get("strategies", {}), data["splits"]["train"]
    packed, padded = runs["packed"], runs["padded"]
    ratio = packed["sequences_per_second"] / padded["sequences_per_second"]
    lines = [
        "",
        "=" * 76,
        "Demo summary",
        f"  data:     {train_split['examples']:,} train sequences (sotu paragraphs, rows of "
        f"{MAX_SEQ_LENGTH} tokens): padded rows {train_split['length']['padded_efficiency']:.0f}% "
        f"real tokens; packed {strategies.get('efficiency', float('nan')):.1f}%, packing factor "
        f"{strategies.get('packing_factor', float('nan')):.2f}",
        f"  model:    tiny BERT, {packed['final']['setup']['params']:,} parameters",
    ]
    for layout, run in runs.items():
        final, curve = run["final"], learning_curve(run["workdir"])
        lines.append(
            f"  {layout:8s}  {final['step']} steps of {final['setup']['rows_per_step']} rows, "
            f"{final['sequences_seen']:,.0f} sequences, {run['sequences_per_second']:,.1f} seq/s;"
            f" eval masked-LM accuracy {curve[1][-1] if curve[1] else float('nan'):.4f}"
        )
    lines.append(
        f"  packed / padded: {ratio:.2f}x the sequences per second (side by side); "
        "most-frequent-token "
        f"baseline {packed['final']['baseline']:.4f}"
    )
    if tuned is not None:
        best = tuned["best"]
        lines.append(
            f"  fine-tuned (packed, sentiment): validation accuracy {best['value']:.4f} vs "
            f"{tuned['baseline']:.4f} for {tuned['baseline_name']}"
            + (f"; test {tuned['test']['accuracy']:.4f}" if "test" in tuned else "")
        )
    lines += [f"  total {seconds / 60:.1f} min", "=" * 76]
    return "\n".join(lines)


def main(argv):
    del argv
    start = time.perf_counter()
    data_dir = os.path.join(FLAGS.workdir, f"sotu_paragraphs_{MAX_SEQ_LENGTH}")
    data = prepare_data(data_dir, MAX_SEQ_LENGTH, FLAGS.dupe_factor, document_mode="blank_line")
    runs = pretrain(FLAGS.workdir, data_dir, FLAGS.steps)
    tuned = None
    if FLAGS.finetune_epochs > 0:
        config = finetune_sentiment.get_config()
        config.init_from = runs["packed"]["workdir"]
        config.train.epochs = FLAGS.finetune_epochs
        tuned = finetune.finetune(config, os.path.join(FLAGS.workdir, "sentiment"))
    print(summary_text(data, runs, tuned, time.perf_counter() - start))
    print(f"  plot: {plot(runs, os.path.join(FLAGS.workdir, 'packed_vs_padded.png'))}")


if __name__ == "__main__":
    app.run(main)
