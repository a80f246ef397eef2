"""`train_and_evaluate(config, workdir)`: the pre-training loop.

    from configs import tiny
    from bert_flax import train
    config = tiny.get_config()
    config.data.data_dir = "workdir/sotu_128"
    final = train.train_and_evaluate(config, "workdir/tiny")

Per step: this process's rows -> global sharded batch -> jitted `train_step` -> optimizer host
work (`optim.after_step`). Every `log.every_steps`: metrics to the console, TensorBoard and
`metrics.jsonl`; every `eval.every_steps`: masked-LM accuracy on held-out data (MLPerf's metric);
every `checkpoint.every_steps` and at the end: an orbax checkpoint (and a restart resumes from
it). SIGTERM saves and stops cleanly. At the end the workdir holds PNG plots.
"""

from __future__ import annotations

import json
import logging as logging_std
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

import optim
from bert_flax import checkpointing, input_pipeline, metrics, plots, sharding
from bert_flax.data.contract import check_batch
from bert_flax.train_setup import TrainSetup, create_train_setup


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


def evaluate(setup: TrainSetup, params: Any, batches: list[dict[str, np.ndarray]]) -> dict:
    """Metrics over the fixed eval set; `masked_lm_accuracy` is correct / all masked tokens."""
    steps = [setup.eval_step(params, sharding.global_batch(setup.mesh, b)) for b in batches]
    summary = metrics.summarize(metrics.sum_metrics(steps))
    return {k: v for k, v in summary.items() if k not in ("steps", "loss")}


def step_rng(seed: int, step: int) -> jax.Array:
    """The dropout key of `step`: a function of the seed and step only, so resuming repeats it."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 1), step)


def describe(setup: TrainSetup) -> dict[str, Any]:
    a = setup.adjustment
    return {
        "params": setup.num_params,
        "mesh": dict(setup.mesh.shape),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "packing_factor": a.packing_factor,
        "rows_per_step": a.batch_size,
        "accumulation": a.accumulation,
        "micro_batch_rows": a.batch_size // a.accumulation,
        "betas": [a.b1, a.b2],
        "max_seq_length": setup.row_shape.max_seq_length,
        "max_sequences_per_row": setup.row_shape.max_sequences_per_pack,
        "max_predictions_per_row": setup.row_shape.max_predictions_per_pack,
    }


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Trains (resuming from `workdir` if it holds checkpoints); returns the final metrics."""
    quiet_library_logs()
    maybe_initialize_distributed(config)
    setup = create_train_setup(config)
    total_steps = config.train.steps
    vocab = setup.model_config.vocab_size
    writer = metrics.MetricsWriter(workdir)
    info = describe(setup)
    logging.info("Setup: %s", json.dumps(info))
    if writer.enabled:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2))
        writer.write_text("config", f"```\n{config}\n```")

    checkpointer = checkpointing.Checkpointer(
        workdir,
        every_steps=config.checkpoint.every_steps,
        keep=config.checkpoint.keep,
        enabled=config.checkpoint.enabled,
    )
    state = setup.state
    progress = {"data_position": 0, "sequences_seen": 0.0, "seed": config.seed}
    restored = checkpointer.restore_latest(state, setup.state_shardings)
    if restored is not None:
        state, progress = restored
        if progress.get("seed") != config.seed:
            raise ValueError(
                f"{workdir} holds a run with seed {progress.get('seed')}, not {config.seed}; "
                "use another workdir or the same seed."
            )
    start_step = int(jax.device_get(state.step))

    train_iter = input_pipeline.train_iterator(
        config, setup.batch_size, setup.row_shape, vocab, start=progress["data_position"]
    )
    eval_set = input_pipeline.eval_batches(config, config.eval.batch_size, setup.row_shape, vocab)
    check_batch(eval_set[0], setup.model_config, setup.row_shape)
    frequent_id, baseline = input_pipeline.most_frequent_token_accuracy(eval_set)
    logging.info(
        "Eval: %d batches; always predicting token %d scores masked-LM accuracy %.4f",
        len(eval_set),
        frequent_id,
        baseline,
    )

    pending: list[dict[str, jax.Array]] = []
    throughput = metrics.Throughput()
    train_summary: dict[str, float] = {}
    eval_summary: dict[str, float] = {}
    started = time.perf_counter()
    step = start_step

    def flush(step: int) -> None:
        nonlocal pending, train_summary
        if not pending:
            return
        total = metrics.sum_metrics(pending)
        pending = []
        progress["sequences_seen"] += total.get("sequences", 0.0)
        train_summary = {
            **metrics.summarize(total),
            **throughput.measure(total),
            **optim.host_metrics(setup.tx, state.opt_state),
        }
        train_summary["sequences_seen"] = progress["sequences_seen"]
        writer.write("train", step, train_summary)
        logging.info("%s", metrics.progress_line(step, total_steps, train_summary))

    def run_eval(step: int) -> None:
        nonlocal eval_summary
        t0 = time.perf_counter()
        eval_summary = evaluate(setup, state.params, eval_set)
        eval_summary["baseline_accuracy"] = baseline
        writer.write("eval", step, eval_summary)
        logging.info(
            "eval step %d | masked_lm_accuracy %.4f (baseline %.4f) | mlm_loss %.4f | "
            "nsp_accuracy %.3f | %.1fs",
            step,
            eval_summary.get("masked_lm_accuracy", float("nan")),
            baseline,
            eval_summary.get("mlm_loss", float("nan")),
            eval_summary.get("nsp_accuracy", float("nan")),
            time.perf_counter() - t0,
        )
        throughput.reset()

    preempted = False
    deadline = started + 60.0 * config.train.max_minutes if config.train.max_minutes else None
    with checkpointing.PreemptionGuard() as guard:
        for step in range(start_step + 1, total_steps + 1):
            local = next(train_iter)
            if step == start_step + 1:
                check_batch(local, setup.model_config, setup.row_shape)
            batch = sharding.global_batch(setup.mesh, local)
            state, step_metrics = setup.train_step(state, batch, step_rng(config.seed, step - 1))
            state = state.replace(opt_state=optim.after_step(setup.tx, state.opt_state, step))
            progress["data_position"] += 1
            pending.append(step_metrics)
            last = step == total_steps or (deadline is not None and time.perf_counter() > deadline)
            stop = guard.requested or checkpointer.reached_preemption(step)
            if step % config.log.every_steps == 0 or last or stop:
                flush(step)
            if step % config.eval.every_steps == 0 or last:
                run_eval(step)
            if step % config.checkpoint.every_steps == 0 or last or stop:
                flush(step)
                checkpointer.save(step, state, dict(progress), force=last or stop)
            if stop:
                preempted = True
                logging.warning("Stopping at step %d after saving (preemption).", step)
            if stop or last:
                break
    del train_iter  # closes the tf.data generator now rather than at interpreter exit
    checkpointer.close()
    writer.close()

    final = {
        "step": step,
        "steps_this_run": step - start_step,
        "seconds_this_run": time.perf_counter() - started,
        "preempted": preempted,
        "sequences_seen": progress["sequences_seen"],
        "baseline_accuracy": baseline,
        "train": train_summary,
        "eval": eval_summary,
        "setup": info,
    }
    if writer.enabled:
        with open(os.path.join(workdir, "final_metrics.json"), "w") as f:
            json.dump(final, f, indent=2, default=float)
        if config.log.plots:
            plots.plot_run(workdir, config.data.data_dir if not config.data.synthetic else None)
    return final
