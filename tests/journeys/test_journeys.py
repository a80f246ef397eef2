"""A researcher's journeys, run as the commands a user types (subprocesses, tiny shapes).

Data: a few speeches of the bundled corpus prepared with the command line at 64 and at 128 tokens.
Each journey runs `python -m bert_flax.train` / `bert_flax.convert` and checks what lands in the
workdir (final_metrics.json, bert_config.json, checkpoints) and what the process printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_flax.data import corpus
from tests.paths import ROOT

# A 1-layer, 32-wide BERT on rows of 64 tokens, by flags as a user would shrink configs/tiny.py.
TINY = [
    "--config=configs/tiny.py",
    "--config.model.num_layers=1",
    "--config.model.hidden_size=32",
    "--config.model.num_heads=2",
    "--config.model.intermediate_size=64",
    "--config.model.max_position_embeddings=128",
    "--config.model.hidden_dropout_rate=0.0",
    "--config.model.attention_dropout_rate=0.0",
    "--config.train.batch_size=8",
    "--config.eval.batch_size=8",
    "--config.eval.num_batches=2",
    "--config.schedule.warmup_steps=1",
    "--config.log.every_steps=1",
    "--config.log.plots=False",
]


def run(*args: str, timeout: float = 600, **popen) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **popen.pop("env", {}))
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def benchmark(module: str, *args: str) -> dict:
    """The JSON line of `python -m <module> *args --json`."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", module, *args, "--json"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def train(workdir, data_dir: str, *flags: str, length: int = 64, **kwargs):
    done = run(
        "bert_flax.train",
        *TINY,
        f"--workdir={workdir}",
        f"--config.data.data_dir={data_dir}",
        f"--config.data.max_seq_length={length}",
        *flags,
        **kwargs,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    with open(os.path.join(workdir, "final_metrics.json")) as f:
        return json.load(f), done.stderr


def progress_of(workdir, step: int) -> dict:
    with open(os.path.join(workdir, "checkpoints", str(step), "progress", "metadata")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[int, str]:
    """Ten speeches prepared by the command line at 64 and at 128 tokens."""
    speeches = tmp_path_factory.mktemp("speeches")
    source = corpus.bundled_corpus_dir()
    for name in sorted(os.listdir(source))[-10:]:
        shutil.copy(os.path.join(source, name), speeches / name)
    out = {}
    for length in (64, 128):
        out[length] = str(tmp_path_factory.mktemp(f"sotu_{length}"))
        done = run(
            "bert_flax.data.create_pretraining_data",
            f"--input={speeches}",
            f"--output_dir={out[length]}",
            f"--max_seq_length={length}",
            "--dupe_factor=1",
            "--num_train_shards=2",
            "--validation_fraction=0.2",
            "--num_workers=1",
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize(
    ("optimizer", "flags"),
    [
        ("sgd", ["--config.optimizer.sgd.momentum=0.5"]),
        ("adamw", ["--config.optimizer.adamw.b2=0.98"]),
        ("lamb", ["--config.train.packing_hparams=raise_betas"]),
        (
            "muon",
            [
                "--config.optimizer.muon.beta=0.9",
                "--config.train.prng_impl=rbg",
                "--config.model.attention_dropout_head_groups=1",
            ],
        ),
        (
            "shampoo",
            [
                "--config.optimizer.shampoo.asynchronous=True",
                "--config.optimizer.shampoo.block_size=32",
                "--config.optimizer.shampoo.start_preconditioning_step=1",
                "--config.optimizer.shampoo.preconditioning_compute_steps=2",
                "--config.optimizer.shampoo.statistics_compute_steps=2",
            ],
        ),
        (
            "soap",
            [
                "--config.optimizer.soap.asynchronous=True",
                "--config.optimizer.soap.preconditioning_compute_steps=2",
                "--config.mesh.rules.vocab=()",
            ],
        ),
    ],
)
def test_every_optimizer_and_model_field_by_flag(prepared, tmp_path, optimizer, flags):
    final, log = train(
        tmp_path,
        prepared[64],
        f"--config.optimizer.name={optimizer}",
        "--config.train.steps=4",
        "--config.eval.every_steps=4",
        *flags,
    )
    assert final["step"] == 4 and np.isfinite(final["train"]["loss"])
    with open(tmp_path / "bert_config.json") as f:
        model = json.load(f)
    assert (model["num_layers"], model["hidden_size"]) == (1, 32)  # --config.model.* reached it
    assert f'"name": "{optimizer}"' in (tmp_path / "config.json").read_text()
    with open(tmp_path / "config.json") as f:  # the model as resolved, not None placeholders
        shown = json.load(f)["model"]
    common = (set(model) & set(shown)) - {"block_sparse"}
    assert {k: shown[k] for k in common} == {k: model[k] for k in common}
    assert shown["preset"] == "tiny" and shown["intermediate_size"] == model["intermediate_size"]
    if optimizer in ("shampoo", "soap"):  # the host's metrics, under the mode's name
        assert "shampoo/staleness" in final["train"]
        assert "shampoo/staleness" in log  # in the console line too
    if optimizer == "muon":  # the dropout settings reached the run and its model too
        assert '"prng_impl": "rbg"' in (tmp_path / "config.json").read_text()
        assert model["attention_dropout_head_groups"] == 1
    if optimizer == "soap":  # a partitioning rule moved by flag, shown in config.json
        with open(tmp_path / "config.json") as f:
            assert json.load(f)["mesh"]["rules"]["vocab"] == []
    if optimizer == "lamb":
        factor = final["setup"]["packing_factor"]
        assert final["setup"]["betas"][0] == pytest.approx(0.9**factor)


@pytest.mark.slow(seconds=80)
def test_two_phases_on_two_data_directories(prepared, tmp_path):
    phase1, _ = train(
        tmp_path, prepared[64], "--config.train.steps=3", "--config.eval.every_steps=3"
    )
    assert phase1["step"] == 3 and progress_of(tmp_path, 3)["data_position"] == 3
    phase2, log = train(
        tmp_path,
        prepared[128],
        "--config.train.steps=5",
        "--config.eval.every_steps=5",
        "--config.data.max_predictions_per_seq=20",
        length=128,
    )
    assert "New phase at step 3" in log
    assert phase2["step"] == 5 and phase2["steps_this_run"] == 2
    assert phase2["setup"]["max_seq_length"] == 128
    progress = progress_of(tmp_path, 5)
    assert progress["data_position"] == 2  # phase 2's data from its beginning
    assert [p["step"] for p in progress["phases"]] == [3]
    resumed, log = train(
        tmp_path, prepared[128], "--config.train.steps=7", "--config.eval.every_steps=7", length=128
    )
    assert "New phase" not in log and resumed["steps_this_run"] == 2
    assert progress_of(tmp_path, 7)["data_position"] == 4  # continued inside phase 2


@pytest.mark.slow(seconds=85)
@pytest.mark.parametrize("devices", [1, 8])
def test_sigterm_a_running_shampoo_job_then_rerun(prepared, tmp_path, devices):
    """A real SIGTERM mid-run saves and exits within 10 s (8 devices: within their grace
    period); the rerun continues from there."""
    flags = [
        "--config.optimizer.name=shampoo",
        "--config.optimizer.shampoo.asynchronous=True",
        "--config.optimizer.shampoo.block_size=32",
        "--config.optimizer.shampoo.start_preconditioning_step=1",
        "--config.optimizer.shampoo.preconditioning_compute_steps=3",
        "--config.eval.every_steps=1000",
        "--config.checkpoint.every_steps=1000",
    ]
    env, within = {}, 10.0
    if devices == 8:
        env["JAX_NUM_CPU_DEVICES"] = "8"
        flags.append("--config.mesh.shape=(4,1,2)")
        # The first save of 8 simulated devices' state took 7.4 s on a loaded 2-core CI
        # machine, so the default 8 s grace (the watchdog) could end it mid-save.
        flags.append("--config.checkpoint.preemption_grace_seconds=25")
        within = 27.0
    args = [
        sys.executable,
        "-m",
        "bert_flax.train",
        *TINY,
        *flags,
        f"--workdir={tmp_path}",
        f"--config.data.data_dir={prepared[64]}",
        "--config.data.max_seq_length=64",
        "--config.train.steps=100000",
    ]
    job = subprocess.Popen(
        args,
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu", **env),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines = []
    for line in job.stderr:  # wait until it is well into training
        lines.append(line)
        if "step 6/100000" in line:
            break
    assert job.poll() is None, "".join(lines[-40:])
    job.send_signal(signal.SIGTERM)
    sent = time.perf_counter()
    rest = job.communicate(timeout=60)[1]
    assert time.perf_counter() - sent < within, rest[-3000:]
    assert job.returncode == 0, rest[-3000:]
    assert "Stopping at step" in rest
    saved = max(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit())
    assert saved >= 6

    resumed, log = train(
        tmp_path,
        prepared[64],
        *flags,
        f"--config.train.steps={saved + 2}",
        env=env,
    )
    assert f"Restored checkpoint of step {saved}" in log
    assert resumed["step"] == saved + 2 and resumed["steps_this_run"] == 2
    assert progress_of(tmp_path, saved + 2)["data_position"] == saved + 2


@pytest.mark.slow(seconds=65)
def test_export_to_hugging_face_then_start_from_it(prepared, tmp_path):
    """The exported model gives transformers the same MLM/NSP logits as the run's own model, and
    a run initialised from the export evaluates exactly as the exported run did."""
    import torch
    import transformers

    from bert_flax.input_pipeline.contract import RowShape
    from bert_flax.input_pipeline.synthetic import random_batch
    from bert_flax.model.bert import BertForPreTraining
    from bert_flax.runs import checkpoint_files

    source = tmp_path / "source"
    final, _ = train(source, prepared[64], "--config.train.steps=3", "--config.eval.every_steps=3")
    hf_dir = tmp_path / "hf"
    done = run("bert_flax.convert", f"--from_workdir={source}", f"--to_hf={hf_dir}")
    assert done.returncode == 0, done.stderr[-3000:]

    config, params = checkpoint_files.load_workdir(str(source))

    batch = random_batch(2, RowShape(64, 1, 10), vocab_size=config.vocab_size, seed=3)
    ours = BertForPreTraining(config).apply({"params": params}, batch, deterministic=True)
    hf = transformers.BertForPreTraining.from_pretrained(str(hf_dir)).eval()
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long),
            attention_mask=torch.tensor(batch["segment_ids"] > 0, dtype=torch.long),
        )
    rows = np.arange(2)[:, None]
    hf_mlm = out.prediction_logits.numpy()[rows, batch["masked_lm_positions"]]
    np.testing.assert_allclose(np.asarray(ours.mlm_logits), hf_mlm, atol=2e-4)
    np.testing.assert_allclose(
        np.asarray(ours.nsp_logits)[:, 0], out.seq_relationship_logits.numpy(), atol=2e-4
    )

    # Learning rate 0 at step 0 (warm-up from 0): the first eval sees the exported parameters.
    started, _ = train(
        tmp_path / "started",
        prepared[64],
        f"--config.init_from={hf_dir}",
        "--config.train.steps=1",
        "--config.eval.every_steps=1",
    )
    for key in ("mlm_loss", "masked_lm_accuracy", "nsp_loss"):
        assert started["eval"][key] == pytest.approx(final["eval"][key], rel=1e-5), key


@pytest.mark.slow(seconds=35)
def test_init_from_a_checkpoint_that_does_not_fit_names_the_parameter(prepared, tmp_path):
    source = tmp_path / "source"
    train(source, prepared[64], "--config.train.steps=1", "--config.eval.every_steps=1")
    done = run(
        "bert_flax.train",
        *TINY,
        f"--workdir={tmp_path / 'wider'}",
        f"--config.data.data_dir={prepared[64]}",
        "--config.data.max_seq_length=64",
        "--config.model.intermediate_size=96",
        f"--config.init_from={source}",
        "--config.train.steps=1",
    )
    assert done.returncode != 0
    assert "bert/layer_0/ffn/intermediate/kernel" in done.stderr
    assert "has shape (32, 64), the model (32, 96)" in done.stderr


# The fine-tuning journey: a few steps (its tiny BERT is the checkpoint's: preset=init_from).
TINY_FINETUNE = [
    "--config=configs/finetune_sentiment.py",
    "--config.model.preset=init_from",
    "--config.train.epochs=0.03",
    "--config.log.every_steps=2",
    "--config.log.plots=False",
]


@pytest.mark.slow(seconds=40)
def test_finetune_from_hugging_face_then_predict_a_file(tmp_path):
    """Fine-tune the bundled sentiment set from a Hugging Face checkpoint (random weights) as
    its config.json describes it, keep the best parameters, predict the test split and then a
    user's file, in input order (through `bert_flax.finetune`, the command's old name)."""
    import transformers

    from bert_flax.tasks.classification import reading as classification_reading

    hf_dir = tmp_path / "hf"
    hf_config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
    )
    transformers.BertForPreTraining(hf_config).save_pretrained(str(hf_dir))
    workdir = tmp_path / "sentiment"
    done = run(
        "bert_flax.train",
        *TINY_FINETUNE,
        f"--workdir={workdir}",
        f"--config.init_from={hf_dir}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Initialised the parameters from {hf_dir}" in done.stderr
    assert "best validation accuracy" in done.stdout
    assert "always predicting 'fresh'" in done.stdout
    best = json.loads((workdir / "best" / "best.json").read_text())
    assert best["metric"] == "accuracy" and best["label_names"] == ["rotten", "fresh"]
    model = json.loads((workdir / "best" / "bert_config.json").read_text())
    assert (model["num_layers"], model["hidden_size"], model["intermediate_size"]) == (1, 32, 64)
    assert model["hidden_dropout_rate"] == 0.1  # the fine-tuning config's, set over the model's
    test_ids = classification_reading.rotten_tomatoes().splits["test"].ids.tolist()
    lines = (workdir / "predictions_test.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == test_ids

    user_file = tmp_path / "reviews.csv"
    user_file.write_text('text\n"a joy from start to finish"\ndull\n"too long, too loud"\n')
    output = tmp_path / "out.jsonl"
    done = run(  # through the old name, an alias for one release
        "bert_flax.finetune", f"--workdir={workdir}", f"--predict={user_file}", f"--output={output}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bert_flax.finetune is now bert_flax.train" in done.stderr
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["id"] for r in records] == [0, 1, 2]
    assert all(r["label"] in ("rotten", "fresh") for r in records)


@pytest.mark.slow(seconds=250)
def test_make_demo_in_miniature(tmp_path, recipe_data):
    """`make demo`'s program with a few steps on the recipe's paragraph data (prepared once per
    session, which the demo reuses) that packs at >= 1.8: both runs with their learning curves,
    both fine-tunings, the summary and the plot."""
    shutil.copytree(recipe_data, tmp_path / "sotu_cpu")
    done = run(
        "bert_flax.demo",
        f"--workdir={tmp_path}",
        "--steps=4",
        "--minutes=2",
        "--speed_rounds=1",
        "--min_rows_per_step=16",
        "--finetune_epochs=0.01",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sotu_cpu" / "summary.json").read_text())
    assert summary["strategies"]["packing_factor"] >= 1.8
    assert summary["vocab"]["size"] == 8192  # the recipe's learned vocabulary
    for line in ("packed / padded:", "fine-tuned (sentiment): validation accuracy", "from random"):
        assert line in done.stdout
    assert re.search(r"^ +packed +\d+ s: 4 steps of 16 rows", done.stdout, re.M)  # its floor
    for layout in ("packed", "padded"):
        train_records = [
            json.loads(line)
            for line in (tmp_path / layout / "metrics.jsonl").read_text().splitlines()
            if '"train"' in line
        ]
        assert train_records[-1]["step"] == 4 and train_records[-1]["train_seconds"] > 0
    assert (tmp_path / "packed_vs_padded.png").stat().st_size > 10_000
    kept = json.loads((tmp_path / "demo_summary.json").read_text())["summary"]
    assert kept.startswith("Demo summary") and kept in done.stdout  # as printed, to publish
    for start in ("pretrained", "random"):
        assert (tmp_path / f"sentiment_{start}_seed0" / "best" / "best.json").exists()


@pytest.mark.slow(seconds=90)
def test_the_readme_learning_benchmarks(tmp_path, recipe_data):
    """The learning benchmarks of the README on the session's recipe data (one masking, which
    --dupe_factor=1 asks for, so they reuse it) in a workdir of their own."""
    shutil.copytree(recipe_data, tmp_path / "sotu_cpu")
    data = [f"--workdir={tmp_path}", "--dupe_factor=1"]
    curves = benchmark(
        "benchmarks.studies.learning_curves", *data, "--seeds=1", "--steps=2", "--eval_every=1",
        "--finetune_epochs=0",
    )  # fmt: skip
    assert curves["steps"] == 2 and len(curves["curves"]["packed"]["step"]) == 2
    assert curves["reused"] == []
    race = benchmark(  # one row: the bookkeeping over several is test_benchmarks_time_to_accuracy's
        "benchmarks.studies.time_to_accuracy", *data, "--rows=packed+lamb",
        "--seeds=1", "--grid=1", "--max_steps=2", "--eval_every=1", "--target=0.99",
        "--speed_rounds=1",
    )  # fmt: skip
    assert race["target"] == 0.99 and race["reused"] == []
    assert set(race["seconds_to_target"]) == {"packed+lamb"}
    assert race["step_time_over_packed_lamb"]["packed+lamb"][0] == 1.0  # the packed rows timed


SPARSE_FFN = [
    "--config.model.block_sparse.enabled=True",
    "--config.model.block_sparse.block_size=16",
    "--config.model.block_sparse.density=0.5",
]
# name -> (mesh shape as (data, fsdp, model), flags, resumed): every back-end that runs on a CPU.
# One variant per mesh layout and per kind of parameters (dense, block-sparse) saves at step 2 and
# resumes; the other back-ends change only the computation and train their 4 steps straight.
MESH_VARIANTS = {
    "xla, data": ("(4,1,1)", [], True),
    "xla, fsdp": ("(1,4,1)", [], True),
    "splash, data x fsdp": ("(2,2,1)", ["--config.model.attention_impl=splash"], True),
    "cudnn, data x fsdp": ("(2,2,1)", ["--config.model.attention_impl=cudnn"], False),
    "block-sparse cpu kernel, fsdp": (
        "(1,4,1)",
        [*SPARSE_FFN, "--config.model.block_sparse.impl=cpu"],
        True,
    ),
    "block-sparse xla, data": (
        "(4,1,1)",
        [*SPARSE_FFN, "--config.model.block_sparse.impl=xla"],
        False,
    ),
    "block-sparse pallas (interpreted), data": (
        "(4,1,1)",
        [*SPARSE_FFN, "--config.model.block_sparse.impl=pallas_interpret"],
        False,
    ),
}
# The TPU kernels take blocks of 128, wider than this model: tests/bert_flax/block_sparse runs
# them interpreted on four devices.


CHECKPOINT_BY_TWO = ["--config.checkpoint.every_steps=2", "--config.eval.every_steps=1000"]


@pytest.fixture(scope="module")
def one_device_run(prepared, tmp_path_factory):
    """`one_device_run(flags)`: the final metrics of 4 steps on one device with XLA's kernels for
    what `flags` select (XLA attention; block-sparse layers through their XLA path), each run
    once a test process: the reference every back-end on four devices must equal."""
    runs = {}

    def reference(flags: list[str]) -> dict:
        sparse = any(flag in SPARSE_FFN for flag in flags)
        key = (*SPARSE_FFN, "--config.model.block_sparse.impl=xla") if sparse else ()
        if key not in runs:
            workdir = tmp_path_factory.mktemp("one_device")
            runs[key], _ = train(
                workdir, prepared[128], *key, *CHECKPOINT_BY_TWO, "--config.train.steps=4",
                length=128,
            )  # fmt: skip
        return runs[key]

    return reference


@pytest.mark.slow(seconds=45)
@pytest.mark.parametrize("variant", sorted(MESH_VARIANTS))
def test_every_backend_trains_resumes_and_evaluates_on_four_devices(
    prepared, one_device_run, tmp_path, variant
):
    """Each attention back-end and block-sparse kernel on a 4-device mesh (simulated CPUs):
    2 steps, saved, resumed for 2 more (the resumed variants; the others 4 steps straight),
    evaluated; the same as 4 steps of XLA's on one device."""
    mesh, flags, resumed = MESH_VARIANTS[variant]
    four = {"env": {"JAX_NUM_CPU_DEVICES": "4"}}
    sharded = [*flags, *CHECKPOINT_BY_TWO, f"--config.mesh.shape={mesh}"]
    if resumed:
        first, _ = train(tmp_path / "four", prepared[128], *sharded, "--config.train.steps=2",
                         length=128, **four)  # fmt: skip
        assert first["step"] == 2
    final, log = train(tmp_path / "four", prepared[128], *sharded, "--config.train.steps=4",
                       length=128, **four)  # fmt: skip
    assert final["step"] == 4
    if resumed:
        assert "Restored checkpoint of step 2" in log and final["steps_this_run"] == 2
    for name, value in one_device_run(flags)["eval"].items():
        assert final["eval"][name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
