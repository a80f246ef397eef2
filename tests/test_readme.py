"""The README's commands stay runnable: each program it shows is run by a named test (on small
settings; the README's figures come from full runs). A command added to the README without a
test, or a test that no longer runs its program, fails here."""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOURNEYS = "tests/journeys/test_journeys.py"
SMOKE = "tests/benchmarks/test_benchmarks_smoke.py"
# program (as the README invokes it) -> (the test that runs it, "path::function", and what in
# that function's source shows it runs the program).
TESTED_BY = {
    "make demo": (f"{JOURNEYS}::test_make_demo_in_miniature", '"bert_flax.demo"'),
    "make lint": ("tests/test_readme.py::test_the_code_is_lint_clean", '"ruff"'),
    "make test": ("tests/test_readme.py::test_ci_runs_make_test", '"make test"'),
    "make venv": ("tests/test_readme.py::test_ci_runs_make_test", '"test: venv"'),
    "-m packing": (
        "tests/packing/test_packing_strategy_set.py::test_cli_json_lines_have_exactly_the_documented_keys",
        "cli.main(",  # what `python -m packing` runs
    ),
    "-m bert_flax.data.create_pretraining_data": (
        f"{JOURNEYS}::prepared",
        '"bert_flax.data.create_pretraining_data"',
    ),
    "-m bert_flax.main": (f"{JOURNEYS}::train", '"bert_flax.main"'),
    "-m bert_flax.finetune": (
        f"{JOURNEYS}::test_finetune_from_hugging_face_then_predict_a_file",
        '"bert_flax.finetune"',
    ),
    "-m bert_flax.profile": (f"{SMOKE}::test_profile_command", '"bert_flax.profile"'),
    "benchmarks/packing_bench.py": (
        f"{SMOKE}::test_packing_bench",
        '"benchmarks/packing_bench.py"',
    ),
    "benchmarks/packed_vs_padded.py": (
        f"{SMOKE}::test_packed_vs_padded_with_its_learning_case",
        '"packed_vs_padded.py"',
    ),
    "benchmarks/time_to_accuracy.py": (
        f"{JOURNEYS}::test_make_demo_in_miniature",
        '"time_to_accuracy.py"',
    ),
    "benchmarks/learning_curves.py": (
        f"{JOURNEYS}::test_make_demo_in_miniature",
        '"learning_curves.py"',
    ),
    "benchmarks/finetune_packed_vs_padded.py": (
        f"{SMOKE}::test_finetune_packed_vs_padded",
        '"finetune_packed_vs_padded.py"',
    ),
    "benchmarks/profile_report.py": (
        f"{SMOKE}::test_profile_report",
        '"benchmarks/profile_report.py"',
    ),
    "-m bert_flax.compile": (
        "tests/bert_flax/test_compile.py::test_compile_command_reports_fit_flops_collectives_and_a_roofline",
        "compile_command(",
    ),
    "benchmarks/compile_table.py": (
        "tests/benchmarks/test_compile_table.py::test_the_docs_table_is_the_benchmarks_json",
        '"benchmarks/compile_table.py"',
    ),
    "benchmarks/block_sparse_bench.py": (
        f"{SMOKE}::test_block_sparse_bench",
        '"benchmarks/block_sparse_bench.py"',
    ),
}

COMMAND = re.compile(r"(?:^|`)\s*(make \w+|python (?:-m [\w.]+|benchmarks/\w+\.py))", re.M)


def readme_programs() -> set[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    return {m.group(1).removeprefix("python ") for m in COMMAND.finditer(text)}


def test_every_readme_command_has_a_test_that_runs_it():
    programs = readme_programs()
    assert len(programs) >= 10, programs  # the pattern still finds the README's commands
    untested = sorted(programs - set(TESTED_BY))
    assert not untested, f"README commands no test runs: {untested}; add them to TESTED_BY."
    for program in sorted(programs):
        test, evidence = TESTED_BY[program]
        path, _, name = test.partition("::")
        with open(os.path.join(ROOT, path)) as f:
            source = f.read()
        functions = {
            node.name: ast.get_source_segment(source, node)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef)
        }
        assert name in functions, f"{test} (for {program!r}) does not exist"
        assert evidence in functions[name], f"{test} does not run {program!r} ({evidence})"


def test_ci_runs_make_test():
    """CI runs `make test` in a fresh clone, and `make test` first builds the venv."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert "make test" in f.read()
    with open(os.path.join(ROOT, "Makefile")) as f:
        assert "test: venv" in f.read()


def test_the_code_is_lint_clean():
    import subprocess
    import sys

    ruff = [sys.executable, "-m", "ruff"]
    for args in (["check", "."], ["format", "--check", "."]):
        done = subprocess.run([*ruff, *args], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
