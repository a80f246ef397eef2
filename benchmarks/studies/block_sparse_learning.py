r"""Block-sparse that pays in learning? A wider block-sparse FFN against the dense one at the same
FLOPs per token, in the same minutes and at the same steps.

    python -m benchmarks.studies.block_sparse_learning --json  # 5 settings; grid and 3 seeds for 2
    python -m benchmarks.studies.block_sparse_learning --minutes=1 --seeds=1 \
        --settings=dense,sparse25_small

The CPU recipe (`configs/cpu_pretrain.py`: its data, prepared once in --workdir, packed, its
optimizer at its learning rate) with the feed-forward layers as named:

  dense              the recipe's FFN (hidden 128 -> 512 -> 128);
  sparseD_LAYOUT     both FFN layers block-sparse at density D % (25 or 10) and the intermediate
                     layer 1/D wider (`block_sparse.wide`: as many nonzero weights, as many FLOPs
                     per token), blocks of --block_size (8: the narrow side has 16 block rows, so
                     10 % leaves every intermediate block an input), layout `random` or `small`
                     (small-world: Watts-Strogatz).

Every run trains for --minutes of wall-clock on an otherwise idle machine (run nothing else),
evaluated every --eval_every steps on the same held-out rows. Runs take turns setting by setting
for each seed, so a change in the machine's load falls on all alike. Seed 0 of every setting at
the recipe's rate; then, for dense and the sparse setting highest at equal seconds, seed 0 at the
other --lr_factors rates (one grid for both: the wider sparse layer has another fan-in, so its
best rate may differ), the rate highest at equal seconds kept; then their other seeds.

Per setting: parameters, the training step timed side by side after the runs
(`timing.side_by_side`) and its FFN blocks alone (the sparse kernels' cost per FLOP against the
dense products'), and eval masked-LM accuracy at equal seconds (each run's last evaluation,
after the same minutes) and at equal steps (the last step a setting's runs and dense's all
evaluated, dense's accuracy there beside it), medians over seeds, beside the most-frequent-token
baseline. A finished run of the same config, data and code is reused (`finished.reusable_run`). A
plot of accuracy against seconds and against sequences, with the step rates, goes to
--workdir/block_sparse_learning.png (--plot copies it). With --json the last line is a JSON
object: baseline, minutes, settings (per setting: learning_rate, parameters, step_seconds,
sequences_per_second, ffn_seconds, accuracy_equal_seconds, equal_steps, accuracy_equal_steps,
dense_accuracy_equal_steps, seeds), best_sparse, learning_rate_grid (seed 0's accuracy at equal
seconds by rate factor), gain_equal_seconds and gain_equal_steps (best sparse minus dense,
medians), reused.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections

from benchmarks.lib import recipe_data
from benchmarks.lib.records import Read, finish
from benchmarks.lib.render import Columns, items_table, points, source, times
from bert_flax import demo
from bert_flax.model.config import BertConfig
from bert_flax.model.layers import BertFeedForward
from bert_flax.runs import finished
from bert_flax.runs.metrics import learning_curve
from bert_flax.runs.plots import plot_packed_vs_padded
from bert_flax.tasks import PreTrainingTask
from bert_flax.train import loop
from bert_flax.train.setup import create_train_setup
from bert_flax.train.timing import Timing, in_turns, side_by_side
from configs import cpu_pretrain

METRIC = "masked_lm_accuracy"
DENSE = "dense"
LAYOUTS = {"random": "random", "small": "watts_strogatz"}
SETTINGS = ("dense", "sparse25_random", "sparse25_small", "sparse10_random", "sparse10_small")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="workdir/bench/block_sparse_learning")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    recipe_data.add_flag(parser)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--eval_every", type=int, default=200)
    parser.add_argument("--block_size", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--lr_factors",
        default="0.5,1,2",
        help="Of the recipe's rate, seed 0 of dense and the best sparse setting.",
    )
    parser.add_argument("--speed_rounds", type=int, default=6)
    parser.add_argument("--plot", default="", help="Also copy the plot here.")
    parser.add_argument("--json", action="store_true", help="End with one JSON line.")
    return parser.parse_args()


def setting_config(
    args: argparse.Namespace, data_dir: str, setting: str, seed: int, factor: float
) -> ml_collections.ConfigDict:
    """The recipe with `setting`'s FFN, for --minutes, at `factor` x its learning rate."""
    config = demo.pretraining_config(
        data_dir, True, args.minutes, seed=seed, eval_every=args.eval_every, recipe=cpu_pretrain
    )
    config.train.steps = 1_000_000  # the clock ends every run
    config.schedule.learning_rate *= factor
    config.schedule.end_learning_rate = config.schedule.learning_rate
    if setting != DENSE:
        density, layout = setting.removeprefix("sparse").split("_")
        config.model.block_sparse.update(
            enabled=True,
            density=int(density) / 100,
            block_size=args.block_size,
            layout=LAYOUTS[layout],
            wide=True,
        )
    return config


def run(args: argparse.Namespace, data_dir: str, setting: str, seed: int, factor: float) -> dict:
    """One run's learning curve and final metrics (reused when it is the same run)."""
    config = setting_config(args, data_dir, setting, seed, factor)
    workdir = os.path.join(args.workdir, f"{setting}_lr{factor:g}_seed{seed}")
    reused = finished.reusable_run(workdir, config, PreTrainingTask(config))
    final = reused or loop.train_and_evaluate(config, workdir)
    loop.exit_if_preempted(final)
    return {
        "config": config,
        "curve": learning_curve(workdir, METRIC),
        "final": final,
        "workdir": workdir,
    }


Seed0Runs = dict[tuple[str, float], dict]  # (setting, rate factor) -> seed 0's run


def seed0_runs(
    args: argparse.Namespace, data_dir: str, settings: list[str], factors: list[float]
) -> tuple[Seed0Runs, str | None]:
    """Seed 0 of every setting at the recipe's rate; then, for dense and the sparse setting highest
    at equal seconds (returned), every other --lr_factors rate: one grid for both sides."""
    seed0 = {(s, 1.0): run(args, data_dir, s, 0, 1.0) for s in settings}
    sparse = [s for s in settings if s != DENSE]
    best_sparse = max(sparse, key=lambda s: demo.final_accuracy(seed0[s, 1.0])) if sparse else None
    for factor in factors:
        for s in (DENSE, best_sparse):
            if s in settings and (s, factor) not in seed0:
                seed0[s, factor] = run(args, data_dir, s, 0, factor)
    return seed0, best_sparse


def chosen_runs(
    args: argparse.Namespace, data_dir: str, settings: list[str], factors: list[float]
) -> tuple[Seed0Runs, str | None, dict[str, list[dict]]]:
    """Seed 0's runs (`seed0_runs`), the best sparse setting, and per setting its runs at its
    best rate factor (highest at equal seconds in seed 0): seed 0's, then --seeds - 1 more."""
    seed0, best_sparse = seed0_runs(args, data_dir, settings, factors)
    best_factor = {
        s: max((f for t, f in seed0 if t == s), key=lambda f: demo.final_accuracy(seed0[s, f]))
        for s in settings
    }
    runs = {s: [seed0[s, best_factor[s]]] for s in settings}
    for seed in range(1, args.seeds):
        for s in (DENSE, best_sparse):
            if s in runs:
                runs[s].append(run(args, data_dir, s, seed, best_factor[s]))
    return seed0, best_sparse, runs


def last_common_step(runs: list[dict]) -> int:
    common = set.intersection(*(set(r["curve"]["step"]) for r in runs))
    if not common:
        raise SystemExit("No step was evaluated by every run: lower --eval_every.")
    return max(common)


def median_at(runs: list[dict], step: int) -> float:
    return statistics.median(r["curve"][METRIC][r["curve"]["step"].index(step)] for r in runs)


def compare(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per setting, medians over seeds at equal seconds (each run's last evaluation) and at equal
    steps: the last step its runs and dense's all evaluated, dense's accuracy there beside it."""
    figures = {}
    for setting, each in runs.items():
        step = last_common_step(each + runs.get(DENSE, []))
        figures[setting] = {
            "accuracy_equal_seconds": statistics.median(r["curve"][METRIC][-1] for r in each),
            "equal_steps": step,
            "accuracy_equal_steps": median_at(each, step),
            "dense_accuracy_equal_steps": median_at(runs[DENSE], step) if DENSE in runs else None,
            "seeds": len(each),
            "steps": statistics.median(r["final"]["step"] for r in each),
            "parameters": each[0]["final"]["setup"]["params"],
        }
    return figures


def timed(runs: dict[str, list[dict]], rounds: int) -> tuple[dict[str, Timing], dict[str, float]]:
    """Each setting's training-loop step, timed in turns on its own batches; and its
    feed-forward blocks alone (`ffn_seconds`) on a batch of the same shape."""
    setups = {s: create_train_setup(each[0]["config"]) for s, each in runs.items()}
    batches = {s: setup.first_train_batches(3) for s, setup in setups.items()}
    steps = side_by_side(setups, batches, rounds=rounds, steps=3)
    rows, length = batches[DENSE if DENSE in batches else next(iter(batches))][0]["input_ids"].shape
    model_configs = {s: setup.model_config for s, setup in setups.items()}
    return steps, ffn_seconds(model_configs, rows * length, rounds=5 * rounds)


def ffn_seconds(model_configs: dict[str, BertConfig], tokens: int, rounds: int) -> dict[str, float]:
    """Each setting's feed-forward block (`BertFeedForward`: both products and the activation,
    forward and backward) on `tokens` tokens, times its layers; timed in turns, median of
    `rounds`. Dense and wide sparse do the same FLOPs, so the ratio is the sparse kernels' cost
    per FLOP against the dense products' at these widths."""
    programs = {}
    for setting, model_config in model_configs.items():
        module = BertFeedForward(model_config)
        x = jax.random.normal(jax.random.key(0), (tokens, model_config.hidden_size))
        params = module.init(jax.random.key(1), x)
        loss = lambda p, x, module=module: jnp.sum(module.apply(p, x) ** 2)
        programs[setting] = (jax.jit(jax.grad(loss, argnums=(0, 1))), params, x)
    for step, params, x in programs.values():  # compile and warm up
        jax.block_until_ready(step(params, x))
    calls = {
        s: (lambda step=step, params=params, x=x: jax.block_until_ready(step(params, x)))
        for s, (step, params, x) in programs.items()
    }
    medians = in_turns(calls, rounds)
    return {s: seconds * model_configs[s].num_layers for s, seconds in medians.items()}


def main() -> None:
    args = parse_args()
    settings = args.settings.split(",")
    factors = [float(f) for f in args.lr_factors.split(",")]
    data_dir, _ = recipe_data.prepare(args)
    seed0, best_sparse, runs = chosen_runs(args, data_dir, settings, factors)
    all_runs = [*seed0.values(), *(r for each in runs.values() for r in each[1:])]
    figures = compare(runs)
    timings, ffn = timed(runs, args.speed_rounds)
    for s, timing in timings.items():
        figures[s]["step_seconds"] = timing.step_seconds
        figures[s]["ffn_seconds"] = ffn[s]
        figures[s]["sequences_per_second"] = timing.sequences_per_second
        figures[s]["learning_rate"] = runs[s][0]["config"].schedule.learning_rate
    baseline = runs[settings[0]][0]["final"]["baseline"]
    print(f"eval masked-LM accuracy (baseline {baseline:.4f})")
    for s, f in figures.items():
        print(f"{s:>16}: {f['parameters']:>10,} parameters, {f['step_seconds'] * 1e3:6.1f} ms a "
              f"step ({f['ffn_seconds'] * 1e3:5.1f} of them FFN); "
              f"{f['accuracy_equal_seconds']:.4f} at {args.minutes:g} min, "
              f"{f['accuracy_equal_steps']:.4f} at step {f['equal_steps']} "
              f"(dense {f['dense_accuracy_equal_steps']:.4f}; {f['seeds']} seeds)")  # fmt: skip
    result = {
        "baseline": baseline,
        "minutes": args.minutes,
        "block_size": args.block_size,
        "settings": figures,
        "best_sparse": best_sparse,
        # Seed 0's accuracy at equal seconds, by factor of the recipe's rate.
        "learning_rate_grid": {
            s: {f"{f:g}": demo.final_accuracy(r) for (t, f), r in seed0.items() if t == s}
            for s in settings
        },
        "reused": [r["workdir"] for r in all_runs if r["final"].get("reused")],
    }
    if best_sparse and DENSE in figures:
        best, dense = figures[best_sparse], figures[DENSE]
        result["gain_equal_seconds"] = (
            best["accuracy_equal_seconds"] - dense["accuracy_equal_seconds"]
        )
        result["gain_equal_steps"] = (
            best["accuracy_equal_steps"] - best["dense_accuracy_equal_steps"]
        )
    path = plot_packed_vs_padded(
        {s: runs[s][0]["curve"] for s in settings},
        {s: timings[s].sequences_per_second for s in settings},
        baseline,
        os.path.join(args.workdir, "block_sparse_learning.png"),
    )
    finish("block_sparse_learning", result, path, args.plot, args.json)


# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


def block_sparse_learning_row(read: Read) -> tuple[str, str]:
    r = read("block_sparse_learning")["result"]
    best, dense = r["best_sparse"], r["settings"]["dense"]
    figures = r["settings"][best]
    return (
        f"wider block-sparse FFN ({best}, same FLOPs a token) vs dense, CPU recipe, "
        f"{r['minutes']:g} minutes",
        f"**{points(r['gain_equal_seconds'])} points at equal seconds**, "
        f"{points(r['gain_equal_steps'])} at equal steps ({figures['accuracy_equal_seconds']:.3f} "
        f"vs {dense['accuracy_equal_seconds']:.3f}, baseline {r['baseline']:.3f}); its FFN costs "
        f"{times(figures['ffn_seconds'] / dense['ffn_seconds'])} the dense one's time",
    )


def rate_factor(item: tuple[str, float]) -> float:
    return float(item[0])


def block_sparse_learning_block(read: Read) -> str:
    r = read("block_sparse_learning")["result"]
    settings = [{"name": name, **figures} for name, figures in r["settings"].items()]
    dense = r["settings"]["dense"]
    columns: Columns = {
        "FFN": lambda s: s["name"],
        "parameters": lambda s: f"{s['parameters']:,}",
        "learning rate": lambda s: f"{s['learning_rate']:g}",
        "step (ms)": lambda s: f"{1e3 * s['step_seconds']:.0f}",
        "FFN blocks (ms)": lambda s: f"{1e3 * s['ffn_seconds']:.1f}",
        "FFN time / dense (same FLOPs)": lambda s: times(s["ffn_seconds"] / dense["ffn_seconds"]),
        "steps in the minutes": lambda s: f"{s['steps']:,.0f}",
        f"accuracy at {r['minutes']:g} min": lambda s: f"{s['accuracy_equal_seconds']:.4f}",
        "accuracy at equal steps (dense's; step)": lambda s: (
            f"{s['accuracy_equal_steps']:.4f} ({s['dense_accuracy_equal_steps']:.4f}; "
            f"{s['equal_steps']:,})"
        ),
        "seeds": lambda s: s["seeds"],
    }
    grid = "; ".join(
        f"{name} "
        + ", ".join(f"{f} x: {a:.4f}" for f, a in sorted(by_factor.items(), key=rate_factor))
        for name, by_factor in r["learning_rate_grid"].items()
        if len(by_factor) > 1
    )
    return (
        f"{source('block_sparse_learning', read)}\n\nEval masked-LM accuracy (most-frequent-token "
        f"baseline {r['baseline']:.4f}), medians over seeds; blocks of {r['block_size']}. Best "
        f"sparse setting {r['best_sparse']}: {points(r['gain_equal_seconds'])} points against "
        f"dense at equal seconds, {points(r['gain_equal_steps'])} at equal steps.\n\n"
        f"{items_table(settings, columns)}\n\nLearning-rate grid (seed 0, accuracy at equal "
        f"seconds by factor of the recipe's rate): {grid}."
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"block_sparse_learning": block_sparse_learning_block}
README_ROW = (
    block_sparse_learning_row,
    "`python -m benchmarks.studies.block_sparse_learning --json` "
    "([results](docs/results.md#does-a-wider-sparse-ffn-learn-more))",
)  # its row of the README's headline table


if __name__ == "__main__":
    main()
