"""The README's commands stay runnable: each command line it shows parses with its program's own
parser (argparse's or absl's, config overrides included; `make` targets are Makefile rules), and
each program is run by a named test (on small settings; the README's figures come from full
runs). A command or flag that does not exist, a command added without a test, or a test that no
longer runs its program, fails here. `python tests/test_readme.py COMMANDS_JSON` is the parse-only
worker."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import runpy
import shlex
import subprocess
import sys

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
    "-m bert_flax.train": (f"{JOURNEYS}::train", '"bert_flax.train"'),
    "-m bert_flax.finetune": (  # the old name of bert_flax.train, for one release
        f"{JOURNEYS}::test_finetune_from_hugging_face_then_predict_a_file",
        '"bert_flax.finetune"',
    ),
    "-m bert_flax.glue": (
        "tests/bert_flax/tasks/glue/test_glue_runner.py::"
        "test_the_command_writes_the_table_and_submission_files",
        '"bert_flax.glue"',
    ),
    "-m bert_flax.convert": (
        f"{JOURNEYS}::test_export_to_hugging_face_then_start_from_it",
        '"bert_flax.convert"',
    ),
    "-m bert_flax.profile": (f"{SMOKE}::test_profile_command", '"bert_flax.profile"'),
    "-m benchmarks.packing_bench": (
        f"{SMOKE}::test_packing_bench",
        '"benchmarks.packing_bench"',
    ),
    "-m benchmarks.packed_vs_padded": (
        f"{SMOKE}::test_packed_vs_padded_with_its_learning_case",
        '"benchmarks.packed_vs_padded"',
    ),
    "-m benchmarks.studies.time_to_accuracy": (
        f"{JOURNEYS}::test_the_readme_learning_benchmarks",
        '"benchmarks.studies.time_to_accuracy"',
    ),
    "-m benchmarks.studies.learning_curves": (
        f"{JOURNEYS}::test_the_readme_learning_benchmarks",
        '"benchmarks.studies.learning_curves"',
    ),
    "-m benchmarks.studies.finetune_packed_vs_padded": (
        f"{SMOKE}::test_finetune_packed_vs_padded",
        '"benchmarks.studies.finetune_packed_vs_padded"',
    ),
    "-m benchmarks.studies.attention_dropout": (
        f"{SMOKE}::test_attention_dropout",
        '"benchmarks.studies.attention_dropout"',
    ),
    "-m benchmarks.studies.label_efficiency": (
        f"{SMOKE}::test_label_efficiency",
        '"benchmarks.studies.label_efficiency"',
    ),
    "-m benchmarks.studies.squad_packed_vs_padded": (
        f"{SMOKE}::test_squad_packed_vs_padded",
        '"benchmarks.studies.squad_packed_vs_padded"',
    ),
    "-m benchmarks.studies.finetune_suite": (
        f"{SMOKE}::test_finetune_suite",
        '"benchmarks.studies.finetune_suite"',
    ),
    "-m benchmarks.profile_report": (
        f"{SMOKE}::test_profile_report",
        '"benchmarks.profile_report"',
    ),
    "-m bert_flax.aot": (
        "tests/bert_flax/aot/test_compile.py::test_compile_command_reports_fit_flops_collectives_and_a_roofline",
        "compile_command(",
    ),
    "-m benchmarks.compile_table": (
        "tests/benchmarks/test_compile_table.py::test_the_markdown_command_prints_the_docs_block",
        '"benchmarks.compile_table"',
    ),
    "-m benchmarks.block_sparse_bench": (
        f"{SMOKE}::test_block_sparse_bench",
        '"benchmarks.block_sparse_bench"',
    ),
    "-m benchmarks.studies.block_sparse_learning": (
        f"{SMOKE}::test_block_sparse_learning",
        '"benchmarks.studies.block_sparse_learning"',
    ),
}

FENCED = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`((?:python|make) [^`\n]+)`")


def readme_commands() -> list[list[str]]:
    """Every `python ...` and `make ...` command line in the README, as argv: the lines of its
    bash blocks (continuations joined, comments dropped) and its inline code."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    lines = [m.group(1) for m in INLINE.finditer(FENCED.sub("", text))]
    for block in FENCED.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    commands = [shlex.split(line, comments=True) for line in lines]
    return [argv for argv in commands if argv and argv[0] in ("python", "make")]


def program_of(argv: list[str]) -> str:
    """A command's program as `TESTED_BY` names it: "make demo", "-m packing", "-m benchmarks.x"."""
    if argv[0] == "make":
        return " ".join(argv[:2])
    return " ".join(argv[1:3] if argv[1] == "-m" else argv[1:2])


def readme_programs() -> set[str]:
    return {program_of(argv) for argv in readme_commands()}


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


def test_every_readme_command_line_parses():
    """Each `make` target is a Makefile rule; each `python` command line, flags and config
    overrides as written, parses with its program's parser (in one worker, see `parse_only`)."""
    commands = readme_commands()
    with open(os.path.join(ROOT, "Makefile")) as f:
        rules = set(re.findall(r"^([\w-]+)\s*:", f.read(), re.M))
    assert {argv[1] for argv in commands if argv[0] == "make"} <= rules
    python = [argv[1:] for argv in commands if argv[0] == "python"]
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), json.dumps(python)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {}, done.stderr[-3000:]


def test_ci_runs_make_test():
    """CI runs `make test` in a fresh clone, and `make test` first builds the venv."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert "make test" in f.read()
    with open(os.path.join(ROOT, "Makefile")) as f:
        assert "test: venv" in f.read()


def test_the_code_is_lint_clean():
    ruff = [sys.executable, "-m", "ruff"]
    for args in (["check", "."], ["format", "--check", "."]):
        done = subprocess.run([*ruff, *args], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


class Parsed(Exception):
    """Raised by the patched parsers once a program's arguments have parsed."""


_ARGPARSE_PARSE = argparse.ArgumentParser.parse_args


def _parse_args_then_stop(self, args=None, namespace=None):
    _ARGPARSE_PARSE(self, args, namespace)
    raise Parsed


def _app_run_then_stop(main, argv=None, flags_parser=None):
    from absl import app

    (flags_parser or app.parse_flags_with_usage)(sys.argv if argv is None else argv)
    raise Parsed


def parse_only(command: list[str]) -> str | None:
    """Runs `python *command` in this process until its parser (argparse's, or absl's through
    `app.run`) has parsed the arguments, and no further; returns None, or why it did not parse.
    The flags it defined in absl's global FLAGS are removed again for the next program."""
    from absl import app, flags

    argparse.ArgumentParser.parse_args = _parse_args_then_stop
    app.run = _app_run_then_stop
    module, script = (command[1], None) if command[0] == "-m" else (None, command[0])
    sys.argv = [module or script, *command[2 if module else 1 :]]
    known, path = set(flags.FLAGS), list(sys.path)
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
    except Parsed:
        return None
    except SystemExit as error:  # the parser's usage error, printed on stderr
        return f"exit status {error.code}"
    except Exception as error:  # a missing program or config file
        return repr(error)
    finally:
        for name in set(flags.FLAGS) - known:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
        sys.path[:] = path
    return "ran to its end without parsing its arguments"


if __name__ == "__main__":
    sys.path[0] = ROOT  # the root, as for `python -m ...` there (not tests/)
    failures = {}
    for command in json.loads(sys.argv[1]):
        error = parse_only(command)
        if error is not None:
            failures[shlex.join(["python", *command])] = error
    print(json.dumps(failures))
