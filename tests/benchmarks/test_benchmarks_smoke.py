"""Benchmarks and the profiler as a user types them, on tiny settings: they run to their JSON
line (or table), what they report is well formed, and the README's row reads what they publish
(benchmarks/lib/blocks.py; published here into the tests' BENCHMARK_RESULTS_DIR). Their
figures come from full runs (benchmarks/results/); this only keeps the docs' commands from
breaking unnoticed (tests/test_docs.py). No speed is asserted (timing belongs to full runs):
each figure is checked against what it is made of (the times and counts the result records, the
files its runs wrote, the plot's size in pixels)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import PIL.Image
import pytest

from bert_flax import tasks
from bert_flax.runs import finished
from bert_flax.tasks.classification import reading as classification_reading
from tests.paths import ROOT

STARTS = ("pretrained", "random")  # label_efficiency's runs: {start}_n{examples}_lr{rate}_seed{s}


def png_size(path) -> tuple[int, int]:
    """(width, height) in pixels of the PNG at `path` (PIL raises if it is not one)."""
    with PIL.Image.open(path) as image:
        assert image.format == "PNG", image.format
        return image.size


def final_metrics(workdir) -> dict:
    """What the run in `workdir` wrote when it ended (`finished.FINAL_METRICS`)."""
    with open(os.path.join(workdir, finished.FINAL_METRICS)) as f:
        return json.load(f)


def whole(count: float) -> bool:
    """Whether `count` (a rate times its denominator) is a whole number of hits."""
    return abs(count - round(count)) < 1e-3


def run_command(*command: str) -> str:
    """stdout of `python *command` run from the repository root (asserting it succeeds)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, cwd=ROOT, env=env, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_benchmark(module: str, *args: str) -> dict:
    """The last JSON line of `python -m <module> *args --json`."""
    stdout = run_command("-m", module, *args, "--json")
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture
def readme_row(load_benchmark):
    """`readme_row(module, result)`: the README row of benchmark `module` ("packing_bench",
    "studies.finetune_packed_vs_padded") rendered from `result`, as (result, figure)."""
    return lambda module, result: load_benchmark(module).README_ROW[0](
        lambda name: {"result": result}
    )


@pytest.mark.slow(seconds=130)
def test_packed_vs_padded_with_its_learning_case(tmp_path, recipe_data, readme_row):
    shutil.copytree(recipe_data, tmp_path / "learn")  # the benchmark reuses prepared data
    result = run_benchmark(
        "benchmarks.packed_vs_padded",
        "--rounds=1",
        "--steps=1",
        "--sample_rows=32",
        "--learn_steps=4",
        "--learn_rows=4",
        f"--learn_data_dir={tmp_path / 'learn'}",
    )
    assert [case["case"] for case in result["cases"]] == ["wikipedia-like 512", "SQuAD 1.1 384"]
    for case in result["cases"]:  # one round: the speed-up is the recorded rates' ratio
        rates = case["packed_sequences_per_s"] / case["padded_sequences_per_s"]
        assert case["speedup"] == pytest.approx(rates)
        steps = case["padded_step_seconds"] / case["packed_step_seconds"]
        assert case["speedup_over_packing_factor"] == pytest.approx(steps)
        assert case["batch_packing_factor"] > 1.5
    learning = result["learning"]
    assert learning["padded"]["steps"] == 4 and learning["packed"]["steps"] < 4
    assert learning["packing_factor"] > 1.5
    assert readme_row("packed_vs_padded", result)[1].count("x at ") == 2


@pytest.mark.slow(seconds=45)
def test_step_cost(tmp_path, recipe_data):
    shutil.copytree(recipe_data, tmp_path / "data")  # the benchmark reuses prepared data
    result = run_benchmark(
        "benchmarks.step_cost",
        f"--data_dir={tmp_path / 'data'}",
        "--dupe_factor=1",  # as recipe_data was prepared
        "--rows=1,2",
        "--rounds=1",
        "--steps=1",
    )
    assert set(result["step_ms"]) == {"packed", "padded"}
    assert list(result["step_ms"]["packed"]) == ["1", "2"]  # JSON keys: the row counts
    assert result["packing_factor"] > 1.5
    line = lambda layout, rows: result["fixed_ms"][layout] + result["per_row_ms"][layout] * rows
    for layout, by_rows in result["step_ms"].items():  # two row counts: the line meets both
        assert [line(layout, int(r)) for r in by_rows] == pytest.approx(list(by_rows.values()))
    # The speed-up is the fitted lines' ratio at the recipe's rows (its sign is the timings'
    # business: one round on a loaded machine can fit a negative line).
    rows = result["recipe_rows"]
    speedup = line("padded", rows["padded"]) / line("packed", rows["packed"])
    assert result["recipe_speedup"] == pytest.approx(speedup)


def test_block_sparse_bench(benchmark_results_dir, readme_row):
    published = os.path.join(ROOT, "benchmarks", "results", "block_sparse_bench.json")
    with open(published) as f:
        before = f.read()
    args = ["--features=256", "--rows=16", "--block_sizes=32", "--densities=0.1,0.05"]
    result = run_benchmark(
        "benchmarks.block_sparse_bench", *args, "--impls=auto,xla", "--repeats=2"
    )
    cases = result["cases"]
    expected = [(32, d, i) for d in (0.1, 0.05) for i in ("cpu", "xla")]  # auto: the kernel
    assert [(c["block_size"], c["density"], c["impl"]) for c in cases] == expected
    for c, name in ((c, n) for c in cases for n in ("fwd", "fwd_bwd")):  # dense over sparse
        ratio = c[f"{name}_dense_ms"] / c[f"{name}_sparse_ms"]
        assert c[f"{name}_speedup"] == pytest.approx(ratio, rel=0.02, abs=0.01), (c, name)
    assert readme_row("block_sparse_bench", result)[0].startswith("block-sparse 256x256")
    with open(os.path.join(benchmark_results_dir, "block_sparse_bench.json")) as f:
        assert json.load(f)["result"] == result
    with open(published) as f:
        assert f.read() == before  # the published figures stay untouched


def test_model_bench(benchmark_results_dir, load_benchmark):
    args = ["--models=tiny", "--lengths=128", "--batch=tiny:1", "--repeats=1", "--matmul_size=64"]
    result = run_benchmark("benchmarks.model_bench", *args)
    assert [r["layout"] for r in result["results"]] == ["padded", "packed"]
    for r in result["results"]:  # the rates are the counts over the recorded times
        assert r["train_seq_per_s"] == pytest.approx(1e3 * r["sequences"] / r["train_ms"])
        flops_per_s = 1e9 * r["train_gflops_per_s"]
        assert r["train_utilisation"] == pytest.approx(flops_per_s / result["matmul_flops_per_s"])
    with open(os.path.join(benchmark_results_dir, "model_bench.json")) as f:
        record = json.load(f)
    assert record["result"] == result
    block = load_benchmark("lib.blocks").BLOCKS["model_bench"](lambda name: record)
    assert "| tiny | 128 | packed | 1 | 2 |" in block  # the results page's block renders it


@pytest.mark.slow(seconds=50)
def test_packing_bench(readme_row):
    stdout = run_command("-m", "benchmarks.packing_bench", "--quick", "--json")
    for heading in ("SQuAD 1.1 (max_len 384)", "Wikipedia-like", "Corpus-like", "== targets"):
        assert heading in stdout
    assert "NNLSHP depth 3" in stdout and "total" in stdout
    result = json.loads(stdout.strip().splitlines()[-1])
    assert set(result) == {"squad", "wikipedia_like", "corpus_like"}
    assert readme_row("packing_bench", result)[1].startswith(
        "padded 44.80%; LP 98.80% (40,195 packs"
    )


@pytest.mark.slow(seconds=25)
def test_profile_command(tmp_path):
    plot = tmp_path / "tiny.png"
    settings = ["--config.model.num_layers=1", "--config.train.batch_size=2"]
    stdout = run_command(
        "-m", "bert_flax.profile", "--config=configs/tiny.py", *settings, "--steps=1",
        "--warmup=1", "--json", f"--plot={plot}",
    )  # fmt: skip
    lines = [json.loads(line) for line in stdout.strip().splitlines() if line.startswith("{")]
    assert any(line.get("class") == "optimizer" for line in lines), lines[:3]
    assert png_size(plot) == (720, 600)  # report.plot_stacked: 6 x 5 inches at 120 dpi


@pytest.mark.slow(seconds=65)
def test_profile_report(tmp_path, readme_row):
    stdout = run_command(
        "-m", "benchmarks.profile_report", "--models=tiny", "--limit=1", "--steps=1", "--warmup=1",
        f"--out_dir={tmp_path}", "--json",
    )  # fmt: skip
    lines = [
        json.loads(line) for line in (tmp_path / "profile_report.jsonl").read_text().splitlines()
    ]
    assert len({line["label"] for line in lines}) == 1  # the first setting
    assert png_size(tmp_path / "profile_breakdown.png") == (720, 600)  # one bar: 6 x 5 in
    result = json.loads(stdout.strip().splitlines()[-1])
    assert [s["label"] for s in result["settings"]] == ["tiny 128 f32 packed lamb"]
    assert "float32" in result["ceilings"]
    assert readme_row("profile_report", result)[1].startswith("non-matmul work ")


@pytest.mark.slow(seconds=90)
def test_finetune_packed_vs_padded(tmp_path, readme_row, load_benchmark):
    result = run_benchmark(
        "benchmarks.studies.finetune_packed_vs_padded",
        "--sets=pairs",
        "--seeds=1",
        "--epochs=0.05",
        "--speed_rounds=1",
        "--speed_steps=1",
    )
    pairs = result["sets"]["pairs"]
    assert pairs["packing_factor"] > 1.5
    rates = pairs["examples_per_second"]
    assert pairs["speedup"] == pytest.approx(rates["packed"] / rates["padded"])
    # The validation accuracies and the majority class's are hits over the one validation split.
    task = load_benchmark("studies.finetune_packed_vs_padded")
    validation = tasks.ClassificationTask(
        task.layout_config("padded", task.write_set("pairs", str(tmp_path)))
    ).labelled.splits["validation"]
    majority = np.bincount(validation.labels).max() / len(validation)
    assert pairs["majority_baseline"] <= majority  # the train split's majority may be the other
    for layout in ("packed", "padded"):
        (accuracy,) = pairs["accuracy_runs"][layout]
        assert accuracy == pairs[f"accuracy_{layout}"] and whole(accuracy * len(validation))
    assert whole(pairs["majority_baseline"] * len(validation))
    gap = pairs["accuracy_padded"] - pairs["accuracy_packed"]
    assert result["max_accuracy_gap"] == pytest.approx(gap)
    assert readme_row("studies.finetune_packed_vs_padded", result)[0].endswith(
        "(median of 1 seeds)"
    )


@pytest.mark.slow(seconds=100)
def test_label_efficiency(tmp_path, recipe_data, load_benchmark):
    shutil.copytree(recipe_data, tmp_path / "sotu_cpu")  # the benchmark reuses prepared data
    result = run_benchmark(
        "benchmarks.studies.label_efficiency",
        f"--workdir={tmp_path}",
        "--pretrain_steps=2",
        "--sizes=60,120",
        "--seeds=1",
        "--grid=1e-3",
        "--tune_size=60",
        "--min_steps=2",
        "--evaluations=1",
        "--epochs=0.01",
    )
    assert [row["train_examples"] for row in result["sizes"]] == [60, 120]
    reviews = classification_reading.rotten_tomatoes()  # what the fine-tuning reads
    test = reviews.splits["test"]
    truth = {int(i): reviews.label_names[label] for i, label in zip(test.ids, test.labels)}
    for row in result["sizes"]:
        assert row["steps"] == 2
        # Each start's figures are its run's, read back from what the run wrote.
        runs = {s: tmp_path / f"{s}_n{row['train_examples']}_lr0.001_seed0" for s in STARTS}
        best = {s: final_metrics(workdir)["best"]["value"] for s, workdir in runs.items()}
        assert (row["pretrained"], row["random"]) == (best["pretrained"], best["random"])
        assert row["gain"] == pytest.approx(best["pretrained"] - best["random"])
        for start, workdir in runs.items():  # test accuracy: hits over its predictions file
            with open(workdir / "predictions_test.jsonl") as f:
                predicted = {r["id"]: r["label"] for r in map(json.loads, f)}
            assert predicted.keys() == truth.keys()
            hits = sum(predicted[i] == label for i, label in truth.items())
            assert row[f"{start}_test"] == pytest.approx(hits / len(truth))
    assert len(result["reused"]) == 2  # the tuning runs at 60 examples, seed 0
    assert png_size(tmp_path / "label_efficiency.png") == (704, 462)  # 6.4 x 4.2 in at 110 dpi
    tables = load_benchmark("lib.blocks")
    assert "| 120 |" in tables.BLOCKS["label_efficiency"](
        lambda name: {
            "result": result,
            "command": "c",
            "date": None,
            "machine": {},
            "commit": "unknown",
        }
    )


@pytest.mark.slow(seconds=90)
def test_squad_packed_vs_padded(tmp_path, recipe_data, load_benchmark):
    shutil.copytree(recipe_data, tmp_path / "sotu_cpu")  # the benchmark reuses prepared data
    result = run_benchmark(
        "benchmarks.studies.squad_packed_vs_padded",
        f"--workdir={tmp_path}",
        "--pretrain_steps=2",
        "--seeds=1",
        "--train_examples=40",
        "--validation_examples=20",
        "--epochs=0.5",
        "--speed_rounds=1",
        "--speed_steps=1",
        "--squad_windows=64",
    )
    assert sorted(result["cloze"]) == [
        "pre-trained/packed", "pre-trained/padded", "random/packed", "random/padded",
    ]  # fmt: skip
    for entry in result["cloze"].values():
        assert 0 <= entry["exact_match"] <= entry["f1"] + 1e-9 <= 100 + 1e-9
    assert result["cloze"]["random/packed"]["packing_factor"] > 1
    for case in result["speed"].values():
        assert case["speedup"] == pytest.approx(
            case["sequences_per_second"]["packed"] / case["sequences_per_second"]["padded"]
        )
    record = {"result": result, "command": "c", "date": None, "machine": {}, "commit": "unknown"}
    tables = load_benchmark("lib.blocks")
    block = tables.BLOCKS["squad_packed_vs_padded"](lambda _: record)
    assert "| pre-trained | packed |" in block and "| squad_1_1_384 |" in block
    assert (
        "from random weights"
        in load_benchmark("studies.squad_packed_vs_padded").squad_row(lambda _: record)[1]
    )


@pytest.mark.slow(seconds=60)
def test_block_sparse_learning(tmp_path, recipe_data):
    shutil.copytree(recipe_data, tmp_path / "sotu_cpu")  # the benchmark reuses prepared data
    # One run a side; the runs a rate grid and more seeds add:
    # test_benchmarks_block_sparse_learning.py.
    result = run_benchmark(
        "benchmarks.studies.block_sparse_learning", f"--workdir={tmp_path}", "--dupe_factor=1",
        "--settings=dense,sparse25_small", "--minutes=0.2", "--eval_every=2", "--seeds=1",
        "--lr_factors=1", "--speed_rounds=1",
    )  # fmt: skip
    dense, sparse = result["settings"]["dense"], result["settings"]["sparse25_small"]
    assert dense["seeds"] == sparse["seeds"] == 1 and result["best_sparse"] == "sparse25_small"
    assert {s: set(g) for s, g in result["learning_rate_grid"].items()} == {
        "dense": {"1"},
        "sparse25_small": {"1"},
    }
    # As many nonzero weights: only the wider layer's biases (and block rounding) add parameters.
    assert 0 < sparse["parameters"] - dense["parameters"] < 0.01 * dense["parameters"]
    assert sparse["equal_steps"] >= 2
    # One timed round each, on the same batches: as many sequences in a step of either.
    per_step = [s["sequences_per_second"] * s["step_seconds"] for s in (dense, sparse)]
    assert per_step[0] == pytest.approx(per_step[1]) and per_step[0] > 1
    assert sparse["dense_accuracy_equal_steps"] == dense["accuracy_equal_steps"] or (
        sparse["equal_steps"] != dense["equal_steps"]
    )
    assert 0 < dense["ffn_seconds"] < dense["step_seconds"]
    assert png_size(tmp_path / "block_sparse_learning.png") == (1650, 462)  # 15 x 4.2 in, 110 dpi


@pytest.mark.slow(seconds=90)
def test_attention_dropout(tmp_path, recipe_data, load_benchmark):
    shutil.copytree(recipe_data, tmp_path / "sotu_cpu")  # the benchmark reuses prepared data
    result = run_benchmark(
        "benchmarks.studies.attention_dropout",
        f"--workdir={tmp_path}",
        "--steps=2",
        "--seeds=1",
        "--dupe_factor=1",
    )
    assert list(result["accuracy"]) == ["0.1", "0"] and result["steps"] == 2
    for rate, (accuracy,) in result["accuracy"].items():  # each run's, hits over masked tokens
        evaluated = final_metrics(tmp_path / f"rate{rate}_seed0")
        assert accuracy == evaluated["eval"]["masked_lm_accuracy"]
        assert whole(accuracy * evaluated["eval"]["masked_tokens"]), evaluated["eval"]
        assert result["baseline"] == evaluated["baseline"]
    record = {"result": result, "command": "c", "date": None, "machine": {}, "commit": "unknown"}
    block = load_benchmark("lib.blocks").BLOCKS["attention_dropout"](lambda name: record)
    assert "| 0.1 |" in block and "| 0 |" in block


@pytest.mark.slow(seconds=60)
def test_finetune_suite(tmp_path, recipe_data, load_benchmark):
    shutil.copytree(recipe_data, tmp_path / "sotu_cpu")  # the benchmark reuses prepared data
    result = run_benchmark(
        "benchmarks.studies.finetune_suite", f"--workdir={tmp_path}", "--kinds=multi_label",
        "--pretrain_steps=2", "--seeds=2", "--train_examples=60", "--epochs=0.5",
        "--speed_rounds=1", "--speed_steps=1",
    )  # fmt: skip
    assert list(result["kinds"]) == ["multi_label"]
    for kind in result["kinds"].values():
        assert sorted(kind["runs"]) == [
            "pre-trained/packed", "pre-trained/padded", "random/packed", "random/padded",
        ]  # fmt: skip
        for start, gap in kind["gaps"].items():
            padded, packed = (kind["runs"][f"{start}/{layout}"] for layout in ("padded", "packed"))
            assert gap["gap"] == pytest.approx(padded["median"] - packed["median"])
            spread = max(max(r["per_seed"]) - min(r["per_seed"]) for r in (padded, packed))
            assert gap["spread"] == pytest.approx(spread)
            assert padded["metrics"][kind["metric"]] == pytest.approx(padded["median"])
            assert len(packed["per_seed"]) == 2
        speed = kind["speed"]
        assert speed["packing_factor"] > 1
        assert speed["speedup"] == pytest.approx(
            speed["sequences_per_second"]["packed"] / speed["sequences_per_second"]["padded"]
        )
    record = {"result": result, "command": "c", "date": None, "machine": {}, "commit": "unknown"}
    suite = load_benchmark("studies.finetune_suite")
    block = suite.BLOCKS["finetune_suite"](lambda _: record)
    factor = result["kinds"]["multi_label"]["speed"]["packing_factor"]
    assert "| multi_label | pre-trained | micro_f1 |" in block
    assert f"| multi_label | {factor:.2f} |" in block  # the speed table
    assert "multi_label micro_f1" in suite.suite_row(lambda _: record)[1]
    gaps = [g for k in result["kinds"].values() for g in k["gaps"].values()]
    assert result["max_gap_beyond_spread"] == pytest.approx(
        max(abs(g["gap"]) - g["spread"] for g in gaps)
    )


def test_loss_bench():
    result = run_benchmark("benchmarks.loss_bench", "--rounds=1", "--repeats=1")
    assert len(result) == 4
    for case in result.values():  # one round: the speed-up is the recorded times' ratio
        assert case["speedup"] == pytest.approx(case["reference_ms"] / case["ours_ms"])
        assert case["speedup_error"] == 0


def test_optimizer_bench():
    result = run_benchmark("benchmarks.optimizer_bench", "--quick", "--parts=c")
    assert set(result["root_seconds"]) == {"64", "128", "256"}


@pytest.mark.slow(seconds=35)
def test_pipeline_bench(tmp_path):
    args = ["--seq_lengths=128", "--batch_size=8", "--batches=2", "--warmup=1"]
    result = run_benchmark("benchmarks.pipeline_bench", f"--workdir={tmp_path}", *args)
    creation = result["lengths"]["128"]["creation"]
    assert [run["workers"] for run in creation] == [1, 2]
    assert creation[0]["examples"] == creation[1]["examples"] > 0


@pytest.mark.slow(seconds=80)
def test_prepare_bench(tmp_path):
    sizes = ["--documents=8", "--paragraphs=2", "--documents_per_file=4"]
    shards = ["--documents_per_bucket=4", "--documents_per_shard=4", "--num_workers=1"]
    result = run_benchmark("benchmarks.prepare_bench", f"--workdir={tmp_path}", *sizes, *shards)
    assert [size["documents"] for size in result["sizes"]] == [8]
    assert all(beam["identical"] for beam in result["beam"].values())


@pytest.mark.slow(seconds=130)
def test_optimizer_race(tmp_path):
    budget = ["--steps=2", "--eval_every=1", "--eval_batches=1", "--seeds=1"]
    studies = ["--lr_multipliers", "1", "--warmups", "1", "--root_intervals", "--max_staleness"]
    result = run_benchmark(
        "benchmarks.studies.optimizer_race", f"--data_dir={tmp_path / 'data'}", *budget, *studies,
        "--ablations", "--speed_rounds=1", "--speed_steps=1", f"--plot_dir={tmp_path}",
    )  # fmt: skip
    assert set(result["steps_to_target"]) == {"adamw", "lamb", "shampoo"}
