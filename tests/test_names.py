"""Docs, docstrings and comments name only what exists: every `bert_flax.x.y`, `optim.x`,
`packing.x`, `benchmarks.x` (module, function, class or its member), module by its own name
(`timing.side_by_side`), `from M import N`, repository path and `.py` file that README.md,
docs/*.md and the comments and strings of the code name (read from the source, nothing
imported). The commands' flags are checked by tests/test_docs.py."""

from __future__ import annotations

import ast
import functools
import os
import re
import tokenize

from tests.paths import ROOT
from tests.test_docs import DOCS, doc_text, line_of

# Names of this repository's modules, functions and files, as docs and docstrings write them.
SOURCES = ("bert_flax", "optim", "packing", "benchmarks", "configs")
TOP = (*SOURCES, "docs", "tests", "tools", "notebooks", "constraints")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(SOURCES[:4])})(?:\.\w+)+)(?![\w/])")
# `timing.side_by_side`: a module by its own name (any module of that name), unless that name is
# also a config field's or a usual variable's (`config.model`, `layout.to_dense`).
SHORT = re.compile(r"(?<![\w./-])([a-z_]+)\.([A-Za-z_]\w*)\b")
VARIABLES = {"config", "train", "model", "data", "layout", "block_sparse", "setup", "report"}
VARIABLES |= {"bert", "strategy_set", "task", "table", "lp"}
CONTAINERS = {"update", "items", "keys", "values", "get", "append"}  # `metrics.update(...)`
FILE_TYPES = {"md", "png", "py", "cc", "json", "jsonl", "txt", "csv", "tsv"}  # `optim.md`: a file
IMPORTED = re.compile(rf"\bfrom ((?:{'|'.join(SOURCES)})(?:\.\w+)*) import \(?(\w+(?:, \w+)*)")
PATH = re.compile(rf"(?<![\w./~$-])((?:{'|'.join(TOP)})/[\w./-]*\w)")
SCRIPT = re.compile(r"(?<![\w./~$-])((?:\w+/)*\w+\.py)\b")  # also relative to a package
ELSEWHERE = {"run_squad.py", "download_glue_data.py"}  # other projects' scripts
SKIPPED = {".git", ".venv", "workdir", "__pycache__", "build", "node_modules"}


def repo_files() -> list[str]:
    files = []
    for directory, subdirectories, names in os.walk(ROOT):
        subdirectories[:] = [d for d in subdirectories if d not in SKIPPED and "egg-info" not in d]
        files += [os.path.relpath(os.path.join(directory, n), ROOT) for n in names]
    return files


@functools.cache
def module_body(path: str) -> list[ast.stmt]:
    with open(path) as f:
        return ast.parse(f.read()).body


def defined(body: list[ast.stmt]) -> dict[str, ast.AST] | None:
    """The names a module or class body defines (None: any, for a star import or a module
    `__getattr__`), at its top level and in its top-level `if`s and `try`s."""
    names = {}
    for node in body:
        if isinstance(node, (ast.If, ast.Try)):
            inner = defined(node.body + node.orelse + getattr(node, "handlers", []))
            if inner is None:
                return None
            names.update(inner)
        elif isinstance(node, ast.ExceptHandler):
            names.update(defined(node.body) or {})
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names[alias.asname or alias.name.partition(".")[0]] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in getattr(node, "targets", [getattr(node, "target", None)]):
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
    return names


def module_path(parts: list[str]) -> str | None:
    base = os.path.join(ROOT, *parts)
    for path in (f"{base}.py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def resolves(dotted: str) -> bool:
    """Whether `a.b.c` names a module of the repository, a name its module defines, or a member
    of a class defined there (read from the source, nothing imported); what a function returns,
    or a class inherits, is not followed."""
    parts = dotted.split(".")
    modules = [i for i in range(len(parts), 0, -1) if module_path(parts[:i])]
    if not modules:
        return False
    rest, body = parts[modules[0] :], module_body(module_path(parts[: modules[0]]))
    for name in rest:
        names = defined(body)
        if names is None:
            return True
        if name not in names:
            return False
        node = names[name]
        if not isinstance(node, ast.ClassDef) or node.bases:
            return True
        body = node.body
    return True


@functools.cache
def modules_named() -> dict[str, list[list[str]]]:
    """Each module's own name -> the modules of that name, as their dotted parts."""
    modules = {}
    for path in repo_files():
        parts = path.removesuffix(".py").removesuffix("/__init__").split("/")
        if path.endswith(".py") and parts[0] in SOURCES:
            modules.setdefault(parts[-1], []).append(parts)
    return modules


def named_in(text: str, files: list[str], where: str = "") -> list[tuple[int, str]]:
    """(offset, name) of every stale name in `text`. A `.py` path that does not start at the
    root is looked up from the folder of the file `where` it is written and the folders above
    (`metrics.py` in bert_flax/runs/ is bert_flax/runs/metrics.py), or, in a doc, anywhere."""
    stale = [
        (m.start(), m.group(1))
        for m in DOTTED.finditer(text)
        if m.group(1).rpartition(".")[2] not in FILE_TYPES and not resolves(m.group(1))
    ]
    for m in SHORT.finditer(text):
        module, name = m.groups()
        if module in VARIABLES or module in SOURCES or name in FILE_TYPES | CONTAINERS:
            continue
        known = modules_named().get(module, [])
        if known and not any(resolves(".".join([*parts, name])) for parts in known):
            stale.append((m.start(), m.group(0)))
    for m in IMPORTED.finditer(text):
        stale += [
            (m.start(), f"{m.group(1)}.{name}")
            for name in m.group(2).split(", ")
            if not resolves(f"{m.group(1)}.{name}") and module_path(m.group(1).split("."))
        ]
    stale += [
        (m.start(), m.group(1))
        for m in PATH.finditer(text)
        if not os.path.exists(os.path.join(ROOT, m.group(1)))
        and not resolves(m.group(1).replace("/", "."))  # configs/default.for_accelerators
    ]
    folders = [os.path.dirname(where)]
    while folders[-1]:
        folders.append(os.path.dirname(folders[-1]))
    for m in SCRIPT.finditer(text):
        path = m.group(1)
        if path.partition("/")[0] in TOP or path in ELSEWHERE:
            continue
        if where.endswith(".md"):
            found = any(f == path or f.endswith(f"/{path}") for f in files)
        else:
            found = any(os.path.isfile(os.path.join(ROOT, d, path)) for d in folders)
        if not found:
            stale.append((m.start(), path))
    return stale


def code_texts(path: str) -> list[tuple[int, str]]:
    """(line, text) of the comments and string literals of a Python file."""
    with open(os.path.join(ROOT, path)) as f:
        tokens = tokenize.generate_tokens(f.readline)
        return [
            (token.start[0], token.string)
            for token in tokens
            if token.type in (tokenize.COMMENT, tokenize.STRING)
        ]


def test_docs_and_docstrings_name_what_exists():
    """Every `bert_flax.x.y`, `optim.x`, `packing.x`, `benchmarks.x` (module, function, class or
    its member), module by its own name (`timing.side_by_side`), `from M import N`, repository
    path and `.py` file that README.md, docs/*.md and the comments and strings of the code name
    exists (the run records' commands excepted)."""
    files = repo_files()
    stale = []
    for path in DOCS:
        text = doc_text(path)
        found = named_in(text, files, path)
        stale += [f"{path}:{line_of(text, at)}: {name}" for at, name in found]
    sources = sorted(f for f in files if f.endswith(".py") and f.partition("/")[0] in SOURCES)
    for path in sources:
        for line, text in code_texts(path):
            stale += [
                f"{path}:{line + text.count(chr(10), 0, at)}: {name}"
                for at, name in named_in(text, files, path)
            ]
    assert len(sources) > 100, sources  # the code is found
    assert not stale, "Names of nothing in this repository:\n" + "\n".join(stale)
