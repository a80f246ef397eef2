"""`train_and_evaluate(config, workdir)`: the training loop of every task (`config.task`).

    from configs import tiny
    from bert_flax.train import loop
    config = tiny.get_config()
    config.data.data_dir = "workdir/sotu_128"
    final = loop.train_and_evaluate(config, "workdir/tiny")

Per step: this process's rows -> global sharded batch -> jitted `train_step` -> optimizer host
work (`optim.after_step`). Every `log.every_steps`: metrics to the console, TensorBoard and
`metrics.jsonl`; at every evaluation interval: the task's metrics on held-out data (masked-LM
accuracy, MLPerf's metric, for pre-training); at every checkpoint interval and at the end: an
orbax checkpoint (the steps and intervals: `setup.RunLength`; a restart resumes from it, at the
data position it had reached, computed rather than replayed). A checkpoint of other prepared data
starts a new phase (two-phase pre-training: same parameters, optimizer state and step; the new
data from its beginning). Without a checkpoint, `config.init_from` gives the
starting parameters (a Hugging Face or Google BERT checkpoint, a bert_flax directory, or another
run's workdir). SIGTERM, at any point, saves and stops within `checkpoint.preemption_grace_seconds`
(or keeps the last complete checkpoint). At the end the workdir holds PNG plots, and a fine-tuning
task's best parameters have predicted its test split.
"""

from __future__ import annotations

import dataclasses
import json
import logging as logging_std
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

import optim
from bert_flax import errors, sharding
from bert_flax.block_sparse import resolve_impl
from bert_flax.model import bert as bert_model
from bert_flax.model.config import BertConfig, resolved_config_section
from bert_flax.runs import fingerprint, metrics, parameters, pretrained
from bert_flax.runs.finished import FinalMetrics, write_final
from bert_flax.tasks import Task, task_class
from bert_flax.train import resume
from bert_flax.train.resume import Progress
from bert_flax.train.setup import TrainSetup, create_train_setup
from bert_flax.train.step import TrainState

# Input iterators of preempted runs, kept open until the process exits (`exit_if_preempted`).
_PREEMPTED_INPUTS: list[Any] = []


def quiet_library_logs() -> None:
    """Drops orbax's per-save INFO chatter from the console (warnings still show)."""

    class _Filter(logging_std.Filter):
        def filter(self, record: logging_std.LogRecord) -> bool:
            return record.levelno >= logging_std.WARNING or "orbax" not in record.pathname

    handler = logging.get_absl_handler()
    if not any(isinstance(f, _Filter) for f in handler.filters):
        handler.addFilter(_Filter())


def maybe_initialize_distributed(config: ml_collections.ConfigDict) -> None:
    """`jax.distributed.initialize()` when `config.distributed.initialize` (auto-detects the
    cluster on TPU pods and SLURM/Open MPI; explicit address/num_processes/process_id win)."""
    dist = config.distributed
    if not dist.initialize or jax.distributed.is_initialized():
        return
    kwargs: dict[str, Any] = {}
    if dist.coordinator_address:
        kwargs["coordinator_address"] = dist.coordinator_address
    if dist.num_processes > 0:
        kwargs["num_processes"] = dist.num_processes
    if dist.process_id >= 0:
        kwargs["process_id"] = dist.process_id
    jax.distributed.initialize(**kwargs)
    logging.info(
        "jax.distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def evaluate(
    setup: TrainSetup,
    params: Any,
    batches: list[dict[str, np.ndarray]],
    *,
    stop_requested: Callable[[], bool] = lambda: False,
    max_minutes: float = 0.0,
    progress_seconds: float = 30.0,
) -> tuple[dict[str, float], bool]:
    """(metrics over the eval set, whether it ran to the end). It stops early when
    `stop_requested()` (preemption) or after `max_minutes`, and logs its progress every
    `progress_seconds`."""
    started = last_report = time.perf_counter()
    steps, outputs, complete = [], [], True
    for index, batch in enumerate(batches):
        now = time.perf_counter()
        if stop_requested() or (max_minutes and now - started > 60.0 * max_minutes):
            complete = False
            logging.warning("Evaluation stopped after %d of %d batches.", index, len(batches))
            break
        if now - last_report > progress_seconds:
            logging.info("eval: %d/%d batches, %.0fs", index, len(batches), now - started)
            last_report = now
        sums, out = setup.eval_step(params, sharding.global_batch(setup.mesh, batch))
        steps.append(sums)
        outputs.append(out)
    summary = metrics.summarize(metrics.sum_metrics(steps)) if steps else {}
    summary = {k: v for k, v in summary.items() if k not in ("steps", "loss")}
    summary["eval_batches"] = float(len(steps))
    if complete and steps and outputs[0]:  # the task's scoring needs the whole set
        summary.update(setup.task.score_outputs(jax.device_get(outputs)))
    return summary, complete


def describe(setup: TrainSetup) -> dict[str, Any]:
    """What the setup resolved (config.json's "resolved"): mesh, packing adjustment, run length,
    task, the attention backend, and the block-sparse layers' implementation where the model has
    them."""
    a, length = setup.adjustment, setup.run_length
    info = {
        "params": setup.num_params,
        "mesh": dict(setup.mesh.shape),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "packing_factor": a.packing_factor,
        "rows_per_step": a.batch_size,
        "accumulation": a.accumulation,
        "micro_batch_rows": a.batch_size // a.accumulation,
        "betas": [a.b1, a.b2],
        "examples_per_step": round(a.batch_size * a.packing_factor, 1),
        "steps": length.steps,
        "warmup_steps": length.warmup_steps,
        "eval_every_steps": length.eval_every_steps,
        "checkpoint_every_steps": length.checkpoint_every_steps,
        **({"steps_per_epoch": length.steps_per_epoch} if length.steps_per_epoch else {}),
        "peak_learning_rate": setup.config.schedule.learning_rate * a.learning_rate_scale,
        "attention_impl": setup.attention_impl,
        **setup.task.describe(),
    }
    model = setup.model_config
    if model.block_sparse is not None:  # the implementation its layers use ("auto" resolved)
        sparse = model.block_sparse
        info["block_sparse_impl"] = resolve_impl(sparse.impl, sparse.block_size, model.dtype)
    return info


def initial_state(
    setup: TrainSetup, checkpointer: resume.Checkpointer, workdir: str
) -> tuple[TrainState, Progress]:
    """(state, progress) to start from: the workdir's latest checkpoint if it has one (and if it
    was reading other data, a new phase: same parameters, optimizer state and step, this data
    from its beginning); else `config.init_from`'s parameters or the fresh initialisation."""
    config, data = setup.config, setup.task.identity()
    progress = Progress(
        data_position=0,
        sequences_seen=0.0,
        train_seconds=0.0,
        compile_seconds=0.0,
        seed=config.seed,
        data=data,
    )
    restored = checkpointer.restore_latest(setup.state, setup.state_shardings)
    if restored is None:
        state = setup.state
        if config.init_from:
            state = with_pretrained_params(setup, config.init_from, config.init_from_step)
        return state, progress
    state, saved = restored
    if config.init_from:
        logging.info("Resuming from %s's checkpoint; config.init_from is not used.", workdir)
    if saved.get("seed") != config.seed:
        raise ValueError(
            f"{workdir} holds a run with seed {saved.get('seed')}, not {config.seed}; "
            "use another workdir or the same seed."
        )
    if saved.get("data", data) != data:
        step = int(jax.device_get(state.step))
        logging.warning(
            "New phase at step %d: %s holds a checkpoint of other data; keeping its "
            "parameters, optimizer state and step, and reading this data from its beginning.",
            step,
            workdir,
        )
        phases = [*saved.get("phases", []), {"step": step, "data": data}]
        progress = {**saved, "data_position": 0, "data": data, "phases": phases}
    else:
        progress = {"train_seconds": 0.0, **saved}
    # Checkpoints from before the counters existed; each key where their runs' saves put it.
    progress.setdefault("train_seconds", 0.0)
    progress.setdefault("compile_seconds", 0.0)
    return state, progress


def with_pretrained_params(setup: TrainSetup, path: str, step: int | None) -> TrainState:
    """`setup.state` with the parameters of checkpoint `path` (any `pretrained.checkpoint_kind`),
    placed with the state's shardings; every misfit parameter is named."""
    _, params = pretrained.load_pretrained(path, step)
    params = bert_model.match_layer_layout(params, setup.state.params)  # scanned or not
    params = setup.task.pretrained_params(params, setup.state.params)
    parameters.check_params_fit(params, parameters.flat_shapes(setup.state.params), path)
    params = jax.tree_util.tree_map(
        lambda new, old: np.asarray(new, old.dtype), params, setup.state.params
    )
    logging.info("Initialised the parameters from %s", path)
    return setup.state.replace(params=jax.device_put(params, setup.state_shardings.params))


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, *, task: Task | None = None
) -> FinalMetrics:
    """Trains `task` (default: the config's, `config.task`), resuming from `workdir` if it holds
    checkpoints; then (process 0, unless preempted) predicts the task's test split with the best
    parameters (`Task.predict_test`). Returns the final metrics. `config` is not changed: what
    the run derives from it is `setup.RunLength`."""
    quiet_library_logs()
    maybe_initialize_distributed(config)
    task = task or task_class(config.task)(config)
    grace = config.checkpoint.preemption_grace_seconds
    with resume.PreemptionGuard(grace_seconds=grace) as guard:
        final = _train(config, workdir, guard, task)
    if jax.process_index() == 0 and not final["preempted"]:
        final.update(task.predict_test(workdir))
        if "test" in final:
            logging.info("Test %s", json.dumps(final["test"]))
    return final


def _train(
    config: ml_collections.ConfigDict,
    workdir: str,
    guard: resume.PreemptionGuard,
    task: Task,
) -> FinalMetrics:
    setup = create_train_setup(config, task=task)
    checkpointer = resume.Checkpointer(
        workdir,
        every_steps=setup.run_length.checkpoint_every_steps,
        keep=config.checkpoint.keep,
        enabled=config.checkpoint.enabled,
    )
    # Every input is read (checkpoint, init_from, data) before the first write to the workdir:
    # bad input leaves it as it was.
    try:
        state, progress = initial_state(setup, checkpointer, workdir)
        vocab = setup.model_config.vocab_size
        train_iter = task.train_batches(setup.batch_size, vocab, start=progress["data_position"])
        eval_set, baseline_name, baseline = evaluation_set(config, setup)
    except Exception:
        checkpointer.close()  # its background threads, before the error ends the run
        raise
    start_step = int(jax.device_get(state.step))
    writer = metrics.MetricsWriter(workdir)
    info = write_run_config(config, setup, workdir, writer)
    best = parameters.BestParams(
        workdir,
        metric=task.eval_metric,
        mode=task.eval_metric_mode,
        enabled=config.checkpoint.keep_best and writer.enabled,
    )
    parts = LoopParts(
        config=config,
        setup=setup,
        writer=writer,
        checkpointer=checkpointer,
        guard=guard,
        best=best,
        eval_set=eval_set,
        baseline=baseline,
    )
    loop = Loop(parts, state=state, progress=progress)
    started = time.perf_counter()
    step, preempted, target_reached = loop.run(start_step, train_iter)
    if preempted:  # closing it waits on tf.data's generator thread (seconds): leave it to exit
        _PREEMPTED_INPUTS.append(train_iter)
    del train_iter  # closes the tf.data generator now rather than at interpreter exit
    checkpointer.close()
    writer.close()
    if loop.diverged:
        raise errors.TrainingDiverged(loop.diverged)

    final = FinalMetrics(
        step=step,
        steps_this_run=step - start_step,
        seconds_this_run=time.perf_counter() - started,
        preempted=preempted,
        target_reached=target_reached,
        sequences_seen=progress["sequences_seen"],
        train_seconds=progress["train_seconds"],
        compile_seconds=progress["compile_seconds"],
        baseline=baseline,
        baseline_name=baseline_name,
        train=loop.train_summary,
        eval=loop.eval_summary,
        best=best.record,
        setup=info,
    )
    if writer.enabled:
        write_final(final, workdir)
        if config.log.plots and not preempted:
            task.plot(workdir)
    return final


def evaluation_set(config: ml_collections.ConfigDict, setup: TrainSetup) -> tuple[list, str, float]:
    """(the fixed eval set, checked; the task's trivial predictor and its score on it)."""
    task = setup.task
    eval_set = task.eval_batches(config.eval.batch_size, setup.model_config.vocab_size)
    task.check_batch(eval_set[0], setup.model_config, evaluation=True)
    name, baseline = task.baseline(eval_set)
    logging.info(
        "Eval: %d batches; %s scores %s %.4f", len(eval_set), name, task.eval_metric, baseline
    )
    return eval_set, name, baseline


def write_run_config(
    config: ml_collections.ConfigDict,
    setup: TrainSetup,
    workdir: str,
    writer: metrics.MetricsWriter,
) -> dict[str, Any]:
    """Logs the config (its model as resolved) and the setup, and writes them to the workdir
    (config.json, bert_config.json, fingerprint.json, TensorBoard); returns the setup's
    description."""
    info = describe(setup)
    shown = with_resolved_model(config, setup.model_config)
    logging.info("Config (the model as resolved):\n%s", shown)
    logging.info("Setup: %s", json.dumps(info))
    if writer.enabled:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            # The config with its model resolved, and what the setup resolved (`describe`).
            resolved = {**json.loads(shown.to_json_best_effort()), "resolved": info}
            json.dump(resolved, f, indent=2)
        with open(os.path.join(workdir, parameters.CONFIG_FILE), "w") as f:
            json.dump(setup.model_config.to_dict(), f, indent=2)  # what convert exports with
        fingerprint.write(workdir, fingerprint.of_run(config, setup.task))
        writer.write_text("config", f"```\n{shown}\n```")
    return info


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopParts:
    """What one run's loop works with and never replaces: the config and the train setup, where
    it writes (metrics, checkpoints, the best parameters), the preemption guard, and the eval set
    with the score of the task's trivial predictor on it."""

    config: ml_collections.ConfigDict
    setup: TrainSetup
    writer: metrics.MetricsWriter
    checkpointer: resume.Checkpointer
    guard: resume.PreemptionGuard
    best: parameters.BestParams
    eval_set: list[dict[str, np.ndarray]]
    baseline: float


@dataclasses.dataclass
class Loop:
    """The training loop of one run (`parts`) and what it carries between steps: the state, the
    data position and counters (`progress`, what a checkpoint saves beside the state), the
    metrics not yet logged, and the last train and eval summaries."""

    parts: LoopParts
    state: TrainState
    progress: Progress
    pending: list[dict[str, jax.Array]] = dataclasses.field(default_factory=list)
    throughput: metrics.Throughput = dataclasses.field(default_factory=metrics.Throughput)
    train_summary: dict[str, float] = dataclasses.field(default_factory=dict)
    eval_summary: dict[str, float] = dataclasses.field(default_factory=dict)
    diverged: str = ""  # the error message once too many non-finite steps came in a row

    @property
    def task(self) -> Task:
        return self.parts.setup.task

    def run(self, start_step: int, train_iter: Iterator[dict]) -> tuple[int, bool, bool]:
        """Steps from `start_step` until the last step, the clock, the eval target, divergence
        or preemption; returns (last step, preempted, target reached)."""
        parts, config, setup, task = self.parts, self.parts.config, self.parts.setup, self.task
        length = setup.run_length
        preempted = target_reached = False
        max_seconds = 60.0 * config.train.max_minutes
        deadline = time.perf_counter() + max_seconds if max_seconds else None
        step = start_step
        for step in range(start_step + 1, length.steps + 1):
            local = next(train_iter)
            batch = sharding.global_batch(setup.mesh, local)
            if step == start_step + 1:
                task.check_batch(local, setup.model_config, evaluation=False)
                self.compile(batch, step)
            self.state, step_metrics = setup.loop_step(
                self.state, batch, setup.step_key(step - 1), step
            )
            self.progress["data_position"] += 1
            self.pending.append(step_metrics)
            last = step == length.steps or (deadline is not None and time.perf_counter() > deadline)
            evaluate_now = step % length.eval_every_steps == 0 or last
            save_now = step % length.checkpoint_every_steps == 0 or last
            if (
                step % config.log.every_steps == 0
                or evaluate_now
                or save_now
                or parts.guard.requested
            ):
                self.flush(step)  # before evaluating, so the throughput covers training only
            if self.diverged:
                break
            if evaluate_now and not parts.guard.requested:
                self.evaluate(step)
                target_reached = reached(
                    config.eval.stop_at, self.eval_summary.get(task.eval_metric)
                )
                last = last or target_reached
            stop = parts.guard.requested or parts.checkpointer.reached_preemption(step)
            if (save_now or last or stop) and finite_state(self.state, step):
                parts.checkpointer.save(step, self.state, self.progress.copy(), force=last or stop)
            if stop:
                preempted = True
                logging.warning("Stopping at step %d after saving (preemption).", step)
            if stop or last:
                break
        return step, preempted, target_reached

    def compile(self, batch: dict[str, jax.Array], step: int) -> None:
        """Compiles the train step before the clock starts (the jitted step then finds it in
        its cache): its seconds count in `compile_seconds`, not `train_seconds`."""
        started, setup = time.perf_counter(), self.parts.setup
        setup.train_step.lower(self.state, batch, setup.step_key(step - 1)).compile()
        seconds = time.perf_counter() - started
        self.progress["compile_seconds"] += seconds
        logging.info("Compiled the train step in %.1f s", seconds)
        self.throughput.reset()

    def flush(self, step: int) -> None:
        """Logs and writes the metrics of the steps since the last flush."""
        if not self.pending:
            return
        total = metrics.sum_metrics(self.pending)
        self.pending = []
        progress, parts, setup = self.progress, self.parts, self.parts.setup
        progress["sequences_seen"] += total.get("sequences", 0.0)
        host = optim.host_metrics(setup.tx, self.state.opt_state)
        summary = {**metrics.summarize(total), **self.throughput.measure(total), **host}
        progress["train_seconds"] += summary["step_seconds"] * total["steps"]
        summary["sequences_seen"] = progress["sequences_seen"]
        summary["train_seconds"] = progress["train_seconds"]
        self.train_summary = summary
        parts.writer.write("train", step, summary)
        shown = self.task.train_metrics_shown
        line = metrics.progress_line(step, setup.run_length.steps, summary, host, shown)
        logging.info("%s", line)
        self.diverged = self.diverged or divergence(parts.config, step, summary, parts.checkpointer)

    def evaluate(self, step: int) -> None:
        """Evaluates the current parameters on the eval set; offers them as the best."""
        parts, task, t0 = self.parts, self.task, time.perf_counter()
        summary, complete = evaluate(
            parts.setup,
            self.state.params,
            parts.eval_set,
            stop_requested=lambda: parts.guard.requested,
            max_minutes=parts.config.eval.max_minutes,
        )
        if not summary.get("eval_batches"):
            return
        self.eval_summary = {**summary, "baseline": parts.baseline, "complete": float(complete)}
        parts.writer.write("eval", step, self.eval_summary)
        shown = " | ".join(
            f"{k} {self.eval_summary.get(k, float('nan')):.4f}" for k in task.eval_metrics_shown
        )
        logging.info(
            "eval step %d | %s %.4f (baseline %.4f) | %s | %d batches | %.1fs",
            step,
            task.eval_metric,
            self.eval_summary.get(task.eval_metric, float("nan")),
            parts.baseline,
            shown,
            summary["eval_batches"],
            time.perf_counter() - t0,
        )
        if complete:
            parts.best.offer(
                step,
                self.eval_summary,
                self.state.params,
                parts.setup.model_config,
                {"task": task.name, **task.head_config()},
            )
        self.throughput.reset()


def with_resolved_model(
    config: ml_collections.ConfigDict, model_config: BertConfig
) -> ml_collections.ConfigDict:
    """A copy of `config` whose `model` section shows every value the run's model has, not the
    placeholders that mean "the preset's value"."""
    shown = config.copy_and_resolve_references()
    with shown.unlocked():
        shown.model = resolved_config_section(model_config, config.model.preset)
    return shown


def reached(target: float, value: float | None) -> bool:
    """Whether an evaluation's metric reached `config.eval.stop_at` (0 = no target)."""
    return target > 0 and value is not None and value >= target


def finite_state(state: TrainState, step: int) -> bool:
    """Whether the last step was applied (a checkpoint is worth saving). A host sync, only on
    the steps that save."""
    streak = int(jax.device_get(state.nonfinite_streak))
    if streak:
        logging.warning("Not saving step %d: its last %d steps were not finite.", step, streak)
    return not streak


def divergence(
    config: ml_collections.ConfigDict,
    step: int,
    summary: dict[str, float],
    checkpointer: resume.Checkpointer,
) -> str:
    """The error message when the interval ending at `step` held `train.max_nonfinite_steps`
    consecutive non-finite steps (checked when the metrics are fetched, so up to
    `log.every_steps` later); "" otherwise."""
    limit = config.train.max_nonfinite_steps
    if not limit or summary.get("nonfinite_streak", 0.0) < limit:
        return ""
    latest = checkpointer.latest_step()
    where = (
        f"the last checkpoint (all are finite) is step {latest} in {checkpointer.directory}: "
        "rerunning resumes from it"
        if latest is not None
        else "no checkpoint was saved"
    )
    return (
        f"Training diverged: {summary['nonfinite_streak']:.0f} consecutive steps up to step "
        f"{step} had a non-finite loss or gradient (train.max_nonfinite_steps={limit}; none was "
        f"applied); {where}. Try a lower schedule.learning_rate (now "
        f"{config.schedule.learning_rate:g}), a longer warm-up, train.grad_clip_norm=1.0 (now "
        f"{config.train.grad_clip_norm:g}), or train.dtype=float32 if it is bfloat16."
    )


def exit_if_preempted(final: FinalMetrics) -> None:
    """For a program's main: after a preempted run (saved and closed), exit at once (status 0)
    rather than after the interpreter's teardown of tf.data and XLA, which takes seconds a
    preemption's grace period may not have (0.5 s instead of 5.6 s measured)."""
    if final["preempted"]:
        logging.flush()
        sys.stdout.flush()
        os._exit(0)
