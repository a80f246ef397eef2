"""The docs run: every command the README and docs/*.md show parses with its program's own parser
(argparse's or absl's, config overrides included; `make` targets are Makefile rules; the modules'
docstrings' commands too) and its program is run by a named test (on small settings; the docs'
figures come from full runs), unless its code block is marked as needing what a test cannot have,
e.g. `<!-- needs: a TPU v5e-8 -->` on the line before the block (it still parses). A command or
flag that does not exist, a command added without a test, or a test that no longer runs its program
fails here (a name of nothing: tests/test_names.py). `python tests/test_docs.py COMMANDS_JSON` is
the parse-only worker."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import glob
import importlib.util
import json
import os
import re
import runpy
import shlex
import subprocess
import sys

from tests.paths import ROOT

JOURNEYS = "tests/journeys/test_journeys.py"
SMOKE = "tests/benchmarks/test_benchmarks_smoke.py"
# program (as the README invokes it) -> (the test that runs it, "path::function", and what in
# that function's source shows it runs the program).
TESTED_BY = {
    "make demo": (f"{JOURNEYS}::test_make_demo_in_miniature", '"bert_flax.demo"'),
    "make lint": ("tests/test_docs.py::test_the_code_is_lint_clean", '"ruff"'),
    "make test": ("tests/test_docs.py::test_ci_runs_make_test", '"make test"'),
    "make venv": ("tests/test_docs.py::test_ci_runs_make_test", '"test: venv"'),
    "-m packing": (
        "tests/packing/test_packing_strategy_set.py::test_cli_json_lines_have_exactly_the_documented_keys",
        "cli.main(",  # what `python -m packing` runs
    ),
    "-m bert_flax.data.create_pretraining_data": (
        f"{JOURNEYS}::prepared",
        '"bert_flax.data.create_pretraining_data"',
    ),
    "-m bert_flax.train": (f"{JOURNEYS}::train", '"bert_flax.train"'),
    "-m bert_flax.data.document_histograms": (
        "tests/packing/test_packing_long_context.py::"
        "test_the_command_rewrites_the_bundled_speeches_histogram_at_1024",
        '"bert_flax.data.document_histograms"',
    ),
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
        "tests/bert_flax/aot/test_aot_command.py::test_compile_command_reports_fit_flops_collectives_and_a_roofline",
        "compile_command(",
    ),
    "-m benchmarks.compile_table": (
        "tests/benchmarks/test_benchmarks_compile_table.py::test_the_markdown_command_prints_the_docs_block",
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
    "-m benchmarks.model_bench": (f"{SMOKE}::test_model_bench", '"benchmarks.model_bench"'),
    "-m benchmarks.step_cost": (f"{SMOKE}::test_step_cost", '"benchmarks.step_cost"'),
    "-m benchmarks.loss_bench": (f"{SMOKE}::test_loss_bench", '"benchmarks.loss_bench"'),
    "-m benchmarks.optimizer_bench": (
        f"{SMOKE}::test_optimizer_bench",
        '"benchmarks.optimizer_bench"',
    ),
    "-m benchmarks.pipeline_bench": (
        f"{SMOKE}::test_pipeline_bench",
        '"benchmarks.pipeline_bench"',
    ),
    "-m benchmarks.prepare_bench": (f"{SMOKE}::test_prepare_bench", '"benchmarks.prepare_bench"'),
    "-m benchmarks.studies.optimizer_race": (
        f"{SMOKE}::test_optimizer_race",
        '"benchmarks.studies.optimizer_race"',
    ),
    "-m benchmarks": (
        "tests/benchmarks/test_benchmarks_results.py::"
        "test_every_block_in_the_docs_is_its_results_files_rendering",
        '"benchmarks", "--check"',
    ),
    "-m bert_flax.demo": (f"{JOURNEYS}::test_make_demo_in_miniature", '"bert_flax.demo"'),
    "-m bert_flax.data.verify_packing": (
        "tests/bert_flax/data/test_data_verify.py::test_command_line_exit_status",
        "verify_packing.main(",
    ),
    "-m bert_flax.kernels.block_sparse_cpu": (
        "tests/bert_flax/kernels/test_block_sparse_cpu.py::"
        "test_the_command_prints_the_library_it_built",
        '"bert_flax.kernels.block_sparse_cpu"',
    ),
    "-m bert_flax.tasks.squad.cloze": (
        "tests/bert_flax/tasks/squad/test_squad_cloze.py::test_the_command_writes_train_and_dev",
        '"bert_flax.tasks.squad.cloze"',
    ),
    "-m bert_flax.tasks.token_classification.rule_set": (
        "tests/bert_flax/tasks/token_classification/test_token_classification_task.py::"
        "test_the_command_writes_the_three_files",
        '"bert_flax.tasks.token_classification.rule_set"',
    ),
    "make test-fast": ("tests/test_docs.py::test_ci_runs_make_test", '"test-fast: venv"'),
    "-m tests.test_config_walk": (
        "tests/test_config_walk.py::test_the_config_climbs_back_up_at_most_eight_times",
        "walk()",  # what `python -m tests.test_config_walk` prints
    ),
}

DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/docs/*.md"))]
# A bash block, with the line before it when that says what the block needs that no test has.
FENCED = re.compile(r"^(?:<!-- needs: (.+?) -->\n)?```bash\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`((?:python|make) [^`\n]+)`")
# A results file's record of a run (docs/results.md): the command as it ran then, at its commit.
RECORD = re.compile(r"^`benchmarks/results/.*$", re.M)
HEREDOC = re.compile(r"<<-?'?(\w+)'?\n.*?^\1$", re.M | re.S)


@dataclasses.dataclass(frozen=True)
class Command:
    where: str  # "docs/training.md:64"
    argv: tuple[str, ...]
    needs: str | None  # what it needs that no test has (its block's marker), or None


def _blank(match: re.Match) -> str:
    """The match as spaces, its line breaks kept (so line numbers stay)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def doc_text(path: str) -> str:
    """A doc's text with the records of past runs blanked out."""
    with open(os.path.join(ROOT, path)) as f:
        return RECORD.sub(_blank, f.read())


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def shell_lines(block: str) -> list[tuple[int, str]]:
    """(line offset, text) of each command line of a bash block: heredocs' bodies dropped,
    continuations and quotes spanning lines joined."""
    lines, joined, first = [], "", 0
    for number, line in enumerate(HEREDOC.sub(_blank, block).splitlines()):
        first = first if joined else number
        joined += line
        if joined.endswith("\\"):  # continued on the next line
            joined = joined[:-1]
            continue
        try:
            shlex.split(joined, comments=True)
        except ValueError:  # a quote closes on a later line
            joined += "\n"
            continue
        lines.append((first, joined))
        joined = ""
    return lines


def commands_of(line: str) -> list[tuple[str, ...]]:
    """The `python` and `make` commands of a shell line (between `&&`, `;` and `|`), without
    environment assignments, `...` and the brackets of optional flags; `python -c` and
    `python -` (code, not a program) and template lines (`python -m benchmarks.<name>`) left out."""
    words = [
        w.strip("[]") if w.startswith("[-") or (w.endswith("]") and "[" not in w) else w
        for w in shlex.split(line, comments=True)
    ]
    commands, argv = [], []
    for word in [*words, ";"]:
        if word in ("&&", "||", ";", "|"):
            while argv and re.match(r"\w+=", argv[0]):
                argv.pop(0)
            commands.append(tuple(argv))
            argv = []
        elif word != "...":
            argv.append(word)
    return [
        argv
        for argv in commands
        if argv[:1] in (("python",), ("make",)) and argv[1:2] not in ((), ("-c",), ("-",))
        and argv[1:] != ("-m",) and not any("<" in word for word in argv)
    ]  # fmt: skip


def doc_commands() -> list[Command]:
    """Every `python ...` and `make ...` command of the README and docs/*.md: their bash blocks'
    lines and their inline code."""
    commands = []
    for path in DOCS:
        text = doc_text(path)
        for block in FENCED.finditer(text):
            first = line_of(text, block.start(2))
            for offset, line in shell_lines(block.group(2)):
                where = f"{path}:{first + offset}"
                commands += [Command(where, argv, block.group(1)) for argv in commands_of(line)]
        prose = FENCED.sub(_blank, text)
        for code in INLINE.finditer(prose):
            where = f"{path}:{line_of(prose, code.start())}"
            commands += [Command(where, argv, None) for argv in commands_of(code.group(1))]
    return commands


# A command line of a module's docstring, indented as an example (prose around it is skipped).
DOCSTRING_COMMAND = re.compile(r"^\s*((?:python|make) .*)$")


def docstring_commands() -> list[Command]:
    """Every `python ...` and `make ...` command line (with its continuations) of the module
    docstrings of the repository's packages: checked to parse, as the docs' commands are."""
    commands = []
    for package in PACKAGES:
        for path in sorted(glob.glob(f"{ROOT}/{package}/**/*.py", recursive=True)):
            with open(path) as f:
                docstring = ast.get_docstring(ast.parse(f.read()), clean=False) or ""
            lines = docstring.splitlines()
            for number, line in enumerate(lines):
                start = DOCSTRING_COMMAND.match(line)
                if not start or (number and lines[number - 1].rstrip().endswith("\\")):
                    continue
                text, following = start.group(1), iter(lines[number + 1 :])
                while text.endswith("\\"):
                    text = text[:-1] + next(following, "")
                where = f"{os.path.relpath(path, ROOT)}:{number + 1}"  # the docstring's line
                commands += [Command(where, argv, None) for argv in commands_of(text)]
    return commands


def program_of(argv: tuple[str, ...]) -> str:
    """A command's program as `TESTED_BY` names it: "make demo", "-m packing", "-m benchmarks.x",
    "tools/check_install.py"."""
    if argv[0] == "make":
        return " ".join(argv[:2])
    return " ".join(argv[1:3] if argv[1] == "-m" else argv[1:2])


def test_every_doc_command_has_a_test_that_runs_it():
    commands = doc_commands()
    assert len(commands) >= 100, len(commands)  # the patterns still find the docs' commands
    programs = {program_of(c.argv) for c in commands if not c.needs}
    untested = sorted(
        f"{c.where}: {program_of(c.argv)}" for c in commands if program_of(c.argv) not in TESTED_BY
        and not c.needs
    )  # fmt: skip
    assert not untested, (
        f"Doc commands no test runs: {untested}; add their program to TESTED_BY, or mark the "
        "block `<!-- needs: WHAT -->` when it needs hardware or data a test cannot have."
    )
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


def test_every_needs_marker_is_on_the_line_before_a_bash_block():
    misplaced = [
        f"{path}:{line_of(text, marker.start())}"
        for path in DOCS
        for text in [doc_text(path)]
        for marker in re.finditer(r"^<!-- needs:(?! \S.*? -->\n```bash\n)", text, re.M)
    ]
    assert not misplaced, f"`<!-- needs: WHAT -->` must precede a ```bash line: {misplaced}"


def test_every_doc_command_line_parses():
    """Each `make` target is a Makefile rule; each `python` command line of the docs and of the
    modules' docstrings, flags and config overrides as written, parses with its program's parser
    (in one worker, see `parse_only`); a marked command's program that needs a package not
    installed here is left out."""
    commands = doc_commands() + docstring_commands()
    with open(os.path.join(ROOT, "Makefile")) as f:
        rules = set(re.findall(r"^([\w-]+)\s*:", f.read(), re.M))
    unknown = [f"{c.where}: {shlex.join(c.argv)}" for c in commands
               if c.argv[0] == "make" and c.argv[1] not in rules]  # fmt: skip
    assert not unknown, f"make targets the Makefile lacks: {unknown}"
    python = {shlex.join(c.argv[1:]): c for c in commands if c.argv[0] == "python"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_docs", json.dumps([shlex.split(c) for c in python])],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    failures = json.loads(done.stdout.splitlines()[-1])
    failures = [
        f"{python[command].where}: python {command}: {error}"
        for command, error in failures.items()
        if not (python[command].needs and error.startswith(UNAVAILABLE))
    ]
    assert not failures, "\n".join(failures) + "\n" + done.stderr[-3000:]


def test_ci_runs_make_test():
    """CI runs `make test` in a fresh clone, and `make test` first builds the venv."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert "make test" in f.read()
    with open(os.path.join(ROOT, "Makefile")) as f:
        makefile = f.read()
    assert "test: venv" in makefile
    assert "test-fast: venv" in makefile


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


UNAVAILABLE = "needs a package not installed here"
PACKAGES = ("bert_flax", "optim", "packing", "benchmarks", "configs")


def parse_only(command: list[str]) -> str | None:
    """Runs `python *command` in this process until its parser (argparse's, or absl's through
    `app.run`) has parsed the arguments, and no further; returns None, or why it did not parse.
    A program without arguments is only looked up (it may have no parser). The flags it defined
    in absl's global FLAGS are removed again for the next program."""
    from absl import app, flags

    module, script = (command[1], None) if command[0] == "-m" else (None, command[0])
    if len(command) == (2 if module else 1):
        found = importlib.util.find_spec(module) if module else os.path.isfile(script)
        return None if found else "no such program"
    argparse.ArgumentParser.parse_args = _parse_args_then_stop
    app.run = _app_run_then_stop
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
    except ModuleNotFoundError as error:
        if error.name and error.name.partition(".")[0] not in PACKAGES:
            return f"{UNAVAILABLE} ({error.name})"
        return repr(error)
    except Exception as error:  # a missing config file
        return repr(error)
    finally:
        for name in set(flags.FLAGS) - known:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
        sys.path[:] = path
    return "ran to its end without parsing its arguments"


if __name__ == "__main__":
    failures = {}
    for command in json.loads(sys.argv[1]):
        error = parse_only(command)
        if error is not None:
            failures[shlex.join(command)] = error
    print(json.dumps(failures))
