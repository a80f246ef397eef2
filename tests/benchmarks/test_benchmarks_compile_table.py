"""The TPU table: its readings of one compile (largest batch, rate at a batch) and its rerun
(tests/benchmarks/test_benchmarks_results.py keeps docs/compile.md equal to its JSON)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import jax
import ml_collections
import numpy as np
import pytest

from tests.paths import ROOT


def compiled(bench, rows=16, memory=10.0, state=4.0):
    return bench.Compiled(
        rows=rows, memory=memory, state_memory=state, flops=1.0, collective_bytes=0.0,
        classes={"optimizer": 2.0, "feed_forward": 6.0}, collective_s=1.0, model_flops=1.0,
        model={"attention": "splash"}, compile_s=0.0,
    )  # fmt: skip


def test_the_largest_batch_is_where_state_and_temporaries_per_row_meet_the_hbm(load_benchmark):
    bench = load_benchmark("compile_table")
    # 6 bytes of temporaries at 16 rows: 3/8 a row; 40 - 4 bytes free -> 96 rows, 8 shards.
    assert compiled(bench).largest_rows(hbm_bytes=40.0, shards=8) == 96
    assert compiled(bench).largest_rows(hbm_bytes=41.0, shards=8) == 96  # whole shards only


def test_only_the_per_row_classes_grow_with_the_batch(load_benchmark):
    bench = load_benchmark("compile_table")
    c = compiled(bench)
    assert c.step_s == 9.0
    assert c.step_s_at(32) == pytest.approx(2.0 + 1.0 + 6.0 * 2)  # optimizer, collectives fixed


def test_the_markdown_command_prints_the_docs_block(load_benchmark):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.compile_table", "--markdown"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    tables = load_benchmark("lib.blocks")
    assert done.stdout.strip() == tables.BLOCKS["compile_table"](tables.published)


def test_a_rerun_resumes_its_method_and_keeps_an_older_one_as_before(load_benchmark, tmp_path):
    bench = load_benchmark("compile_table")
    path = str(tmp_path / "compile_table.json")
    bench.save({"method": bench.METHOD, "cells": [{"cell": 1}], "previous": {}}, path)
    assert bench.load(path)["cells"] == [{"cell": 1}]
    optimizer_rows = [{"optimizer": "sgd", "method": "an older method"}]
    older = {"method": "an older method", "cells": [{"cell": 1}], "long_cells": [{"cell": 2}]}
    bench.save(older | {"optimizer_cells": optimizer_rows}, path)
    assert bench.load(path) == {
        "method": bench.METHOD,
        "cells": [],
        "previous": {"method": "an older method", "cells": [{"cell": 1}]},
        "optimizer_cells": optimizer_rows,  # each row names its method: kept until recompiled
    }


def test_a_cell_renders_beside_its_previous_figures(load_benchmark):
    bench = load_benchmark("compile_table")
    cells = []
    for packed, factor in ((True, 2.0), (False, 1.0)):
        cell = bench.Cell("base", 512, "v5e-8", packed, factor, "dots", 16, 96, compiled(bench), {})
        cells.append(cell.as_dict())
    old = dict(cells[0], step_s=18.0, sequences_per_s=1.0, model_flops_per_step=1.0)
    text = bench.rendered({"cells": cells, "previous": {"cells": [old]}})
    assert "| 18000, 1, " in text  # the previous method's step beside the new one
    assert "| BERT-base | 512 | v5e-8 | 2.00 | 2.00 | 1.00 |" in text  # packed / padded
    assert dataclasses.asdict(compiled(bench))["rows"] == 16


def test_the_published_table_is_of_the_current_method(load_benchmark):
    bench = load_benchmark("compile_table")
    assert bench.load(bench.RESULTS)["cells"], "the published cells would be dropped on a rerun"


def test_a_program_too_big_for_the_hbm_is_compiled_at_half_its_rows(load_benchmark, monkeypatch):
    bench = load_benchmark("compile_table")
    tried = []

    def compile_steps(config, devices, factor, evaluate, **fractions):
        tried.append(config.train.batch_size)
        if config.train.batch_size > 32:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM")
        return SimpleNamespace(rows=config.train.batch_size, seconds={"train": 1.0})

    def report(steps, target):
        memory = SimpleNamespace(total=2.0, temporaries=1.0)
        return SimpleNamespace(
            train_memory=memory, rows_per_step=steps.rows, xla_flops=1.0, hlo_flops=0.0,
            collective_bytes=0.0, classes={}, link_bytes_per_s=1.0, model_flops_per_step=1.0,
            model={}, attention_visited_fraction=1.0, attention_needed_fraction=1.0,
        )  # fmt: skip

    monkeypatch.setattr(bench.program, "compile_steps", compile_steps)
    monkeypatch.setattr(bench.roofline, "report", report)
    config = ml_collections.ConfigDict({"train": {"batch_size": 128}, "eval": {"batch_size": 128}})
    assert bench.compile_cell(config, None, devices=[0] * 8, factor=2.0).rows == 32
    assert tried == [128, 64, 32]
    monkeypatch.setattr(bench.program, "compile_steps", lambda *a, **k: tried.pop(99))
    with pytest.raises(IndexError):  # any other error is raised as it is
        bench.compile_cell(config, None, devices=[0] * 8, factor=2.0)


def test_an_optimizers_update_is_its_excess_over_the_reference(load_benchmark):
    bench = load_benchmark("compile_table")
    cell = lambda name, micro: {
        "optimizer": name, "micro_step_s": micro, "accumulation": 4,
        "compiled": {"collective_s": 1.0},
    }  # fmt: skip
    cells = [cell("shampoo", 12.0)]
    assert bench.with_predictions(cells) == cells  # no reference yet: nothing predicted
    shampoo, sgd = bench.with_predictions([*cells, cell(bench.REFERENCE_OPTIMIZER, 10.0)])
    # The model's micro-step (10 - 1 collectives) 4 times, the collectives once, the update.
    assert (shampoo["update_s"], shampoo["step_s"]) == (2.0, 4 * 9.0 + 1.0 + 2.0)
    assert (sgd["update_s"], sgd["step_s"]) == (0.0, 37.0)


def test_the_host_refresh_is_timed_for_every_block_of_the_statistics(load_benchmark, monkeypatch):
    from bert_flax import sharding
    from bert_flax.train.setup import create_train_program
    from configs import tiny_shampoo

    bench = load_benchmark("compile_table")
    config = tiny_shampoo.get_config()
    config.data.synthetic, config.model.scan_layers = True, True
    config.optimizer.shampoo.preconditioning_compute_steps = 5
    program = create_train_program(config, sharding.mesh_of(config.mesh, jax.devices()))
    host = bench.host_refresh(program, sample=2)
    assert host["seconds_per_step"] == pytest.approx(host["seconds_per_refresh"] / 5)
    # A sample of each group is timed and scaled to the group: at 1 ms a block, 1 ms times all.
    with monkeypatch.context() as patch:
        patch.setattr(bench, "_solve_seconds", lambda stat, p, host: 1e-3 * len(stat))
        assert bench.host_refresh(program, sample=2)["seconds_per_refresh"] == pytest.approx(
            1e-3 * host["blocks"]
        )
    # The scanned layers' blocks are the unrolled layers' (each layer blocked on its own).
    config.model.scan_layers = False
    unrolled = create_train_program(config, sharding.mesh_of(config.mesh, jax.devices()))
    assert bench.host_refresh(unrolled, sample=2)["blocks"] == host["blocks"]
    # Per layer Q, K, V, attention output and the FFN's two kernels: 2 factors each, at least.
    assert host["blocks"] > 2 * 6 * 2
    # SOAP's eigenbases, of the same statistics when blocked alike.
    config.optimizer.name = "soap"
    config.optimizer.soap.update(
        {
            k: config.optimizer.shampoo[k]
            for k in config.optimizer.soap
            if k in config.optimizer.shampoo
        }
    )
    soap = create_train_program(config, sharding.mesh_of(config.mesh, jax.devices()))
    assert bench.host_refresh(soap, sample=2)["blocks"] == host["blocks"]
    config.optimizer.name = "lamb"
    lamb = create_train_program(config, sharding.mesh_of(config.mesh, jax.devices()))
    assert bench.host_refresh(lamb) is None


def test_the_long_cells_are_bert_base_at_long_rows_with_the_dense_and_the_skipping_kernel(
    load_benchmark,
):
    bench = load_benchmark("compile_table")
    tpu, gpu = ("splash", "packed_tpu"), ("pallas_gpu", "packed_gpu")
    kernels = {"v5e-8": tpu, "v6e-8": tpu, "h100": gpu}
    expected = {
        ("base", length, target, packed, attention)
        for length in (1024, 2048, 8192)
        for target, pair in kernels.items()
        for packed in (True, False)
        for attention in pair
    }
    assert len(bench.LONG_CELLS) == len(expected) == 36
    assert set(bench.LONG_CELLS) == expected


@pytest.mark.parametrize("length", [1024, 2048, 8192])
def test_a_long_cell_builds_its_length_position_table_and_kernel(load_benchmark, length):
    from bert_flax.aot import targets
    from bert_flax.model.config import from_config_section

    bench = load_benchmark("compile_table")
    for _, _, target, packed, attention in [c for c in bench.LONG_CELLS if c[1] == length]:
        config = bench.cell_config("base", length, packed, 8, targets.target(target), None,
                                   attention)  # fmt: skip
        model = from_config_section(config.model)
        assert config.data.max_seq_length == model.max_position_embeddings == length
        assert (model.attention_impl, model.num_layers) == (attention, 12)
        assert (config.data.packed, config.train.batch_size) == (packed, 8)
    short = bench.cell_config("base", 512, True, 8, targets.target("v5e-8"))
    assert short.data.max_seq_length == from_config_section(short.model).max_position_embeddings
    assert (short.data.max_seq_length, short.model.attention_impl) == (512, "auto")


def test_the_web_like_packing_at_8192_packs_and_skips_most_blocks(load_benchmark):
    import packing
    from bert_flax.aot import packings, targets

    bench = load_benchmark("compile_table")
    spec = bench.packing_spec(8192)
    config = bench.cell_config("base", 8192, True, 8, targets.target("v5e-8"), None, "packed_tpu")
    factor = packings.packing_factor(config, spec)
    visited = packings.attention_visited_fraction(config, spec)
    needed = packings.attention_needed_fraction(config, spec)
    assert factor > 4 and 0 < needed <= visited < 0.5  # the blocks visited hold every score needed
    # Padded: a document a row, so the need is the histogram's mean l^2 over L^2.
    config.data.packed = False
    hist = packing.histogram.long_context_histogram("lognormal_web", 8192)
    lengths = np.arange(hist.size)
    assert packings.packing_factor(config, spec) == 1.0
    assert packings.attention_needed_fraction(config, spec) == pytest.approx(
        (hist * lengths**2).sum() / hist.sum() / 8192**2
    )
    assert bench.packing_spec(512) == "corpus_like"


def long_cell(attention, packed, sequences_per_s, rows, step_s, classes, needed=0.2):
    return {
        "model": "base", "length": 8192, "target": "v5e-8", "packed": packed,
        "attention_impl": attention, "packing_factor": 10.0 if packed else 1.0,
        "sequences_per_s": sequences_per_s, "rows": rows, "step_s": step_s,
        "attention_needed_fraction": needed,
        "compiled": {"classes": classes, "model": {"attention": attention}},
    }  # fmt: skip


def test_the_long_table_reads_the_gain_the_share_and_the_need(load_benchmark):
    bench = load_benchmark("compile_table")
    cells = [
        # Skipping: 0.4 s of attention over 4 rows, a 2 s step; the dense kernel: 2 s over 8 rows.
        long_cell("packed_tpu", True, 95.0, 4, 2.0,
                  {"attention_scores": 0.2, "attention_context": 0.2, "feed_forward": 1.0}),
        long_cell("packed_tpu", False, 10.0, 4, 2.0, {}),
        long_cell("splash", True, 50.0, 8, 4.0, {"attention_fused": 2.0, "attention_output": 1.0}),
        long_cell("splash", False, 10.0, 8, 4.0, {}),
    ]  # fmt: skip
    skipping, today = bench.long_table(cells).splitlines()[2:]
    # Gain 9.5 of a factor 10; 0.4 of 2 s; 0.1 s a row against 0.25 s x 0.2 needed.
    assert skipping == (
        "| 8,192 | v5e-8 | packed_tpu | 10.00 | 9.50 | 0.95 | 20% | 100.000 | 2.00 |"
    )
    assert today == "| 8,192 | v5e-8 | splash | 10.00 | 5.00 | 0.50 | 50% | 250.000 | 5.00 |"
    assert "| - |" in bench.long_table(cells[:2])  # no dense kernel's cell: no need to read against


def test_the_long_block_keeps_the_cells_order_and_names_those_not_compiled(load_benchmark):
    bench = load_benchmark("compile_table")
    skipping = long_cell("packed_tpu", True, 95.0, 4, 2.0, {"attention_fused": 0.4})
    dense = long_cell("splash", True, 50.0, 8, 4.0, {"attention_fused": 2.0})
    padded = [long_cell(k, False, 10.0, 8, 4.0, {}) for k in ("splash", "packed_tpu")]
    block = bench.compile_long_block(lambda name: {"long_cells": [skipping, *padded, dense]})
    rows = [line for line in block.splitlines() if line.startswith("| 8,192")]
    assert [row.split(" | ")[2] for row in rows] == ["splash", "packed_tpu"]  # LONG_CELLS order
    missing = block.split("Not compiled yet: ")[1]
    assert missing.count(" with ") == len(bench.LONG_CELLS) - 4
    assert "packed 8,192 on h100 with packed_gpu" in missing
    assert "8,192 on v5e-8 with" not in missing  # the four given


def test_long_context_compiles_only_the_long_cells_under_their_own_key(
    load_benchmark, monkeypatch, tmp_path
):
    bench = load_benchmark("compile_table")
    out = tmp_path / "compile_table.json"
    bench.save({"method": bench.METHOD, "cells": [{"cell": 1}], "previous": {}}, str(out))
    made = []

    def measure_long_cell(model, length, target, packed, attention):
        made.append((model, length, target, packed, attention))
        classes = {"attention_fused": 1.0}
        return long_cell(attention, packed, 1.0, 8, 1.0, classes) | {
            "length": length,
            "target": target,
        }

    monkeypatch.setattr(bench, "measure_long_cell", measure_long_cell)
    argv = ["compile_table", "--long_context", f"--out={out}", "--targets", "h100"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    assert made == [key for key in bench.LONG_CELLS if key[2] == "h100"]
    results = bench.load(str(out))
    assert results["cells"] == [{"cell": 1}]
    assert [bench._long_key(c) for c in results["long_cells"]] == made
    bench.main()  # a rerun resumes: nothing compiled again
    assert len(made) == 12
