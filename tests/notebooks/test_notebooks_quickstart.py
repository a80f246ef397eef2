"""The Colab notebook stays in step with the code: its cells compile, the API it calls exists,
and it runs end to end in smoke mode (nbclient, `NOTEBOOK_SMOKE=1`: a few steps each)."""

import ast
import importlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.paths import ROOT

NOTEBOOK = ROOT / "notebooks" / "packed_bert_quickstart.ipynb"

# Every project attribute the notebook calls; a rename must update the notebook too.
CALLED = [
    "packing.synthetic.wikipedia_like_histogram",
    "packing.pack_histogram",
    "bert_flax.demo.prepare_data",
    "bert_flax.input_pipeline.datasets.packed_dataset",
    "bert_flax.train.loop.train_and_evaluate",
    "configs.cpu_pretrain.get_config",
    "bert_flax.demo.finetuning_config",
    "bert_flax.profile.report.format_table",
    "bert_flax.profile.configured.profile_config",
    "bert_flax.aot.roofline.compile_for",
    "bert_flax.aot.targets.target",
    "bert_flax.aot.roofline.format_report",
    "configs.bert_base.get_config",
]
CONFIG_FIELDS = [
    "data.data_dir",
    "train.steps",
    "schedule.warmup_steps",
    "eval.every_steps",
    "checkpoint.every_steps",
]


def code_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def resolve(dotted: str):
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_every_code_cell_compiles():
    cells = code_cells()
    assert len(cells) >= 5
    for i, source in enumerate(cells):
        ast.parse(source, filename=f"{NOTEBOOK.name}[code cell {i}]")


@pytest.mark.parametrize("dotted", CALLED)
def test_called_api_exists_and_is_named_in_the_notebook(dotted):
    assert callable(resolve(dotted))
    assert dotted.split(".")[-1] in "\n".join(code_cells())


def test_config_fields_the_notebook_sets_exist():
    from configs import tiny

    config = tiny.get_config()
    for field in CONFIG_FIELDS:
        node = config
        for name in field.split("."):
            node = node[name]
        assert f"config.{field} =" in "\n".join(code_cells())


@pytest.mark.slow(seconds=115)
def test_the_notebook_runs_in_smoke_mode(tmp_path, monkeypatch, recipe_data):
    import nbclient
    import nbformat

    # The data cell reuses prepared data where it finds it: the session's copy of the recipe's.
    shutil.copytree(recipe_data, tmp_path / "workdir" / "notebook" / "sotu")

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    client = nbclient.NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    assert "backend cpu" in printed and "(smoke)" in printed
    assert "validation accuracy" in printed
    assert (tmp_path / "workdir" / "notebook" / "sentiment" / "best" / "best.json").exists()
    assert os.path.isdir(tmp_path / "workdir" / "notebook" / "train" / "checkpoints")
