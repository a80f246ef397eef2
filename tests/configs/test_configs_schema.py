"""configs/default.py is the one schema: every config file in configs/ has exactly its fields, and
every config field the code of bert_flax/, benchmarks/ and optim/ reads or sets is one of them,
none read with `.get(field, default)`.

The code is read statically (the AST). A run config is: a parameter annotated `ConfigDict`
named `config` (one named after a section, e.g. `schedule`, is that section), `FLAGS.config`,
`self.config` in a class that holds one (a task, the train program, the loop), `setup.config`,
`task.config` and `program.config`, and a name assigned from a call to a function that returns a
whole config (annotated `-> ConfigDict`, not a `*section`: `get_config`, `demo.finetuning_config`,
...); a name assigned from a field of one (`data = config.data`) is that field. A chain of
attributes from one is resolved field by field in `default.get_config()` until it reaches a value
(after which the attributes are the value's) or a ConfigDict method."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterator

import ml_collections
import pytest

import configs
from bert_flax.tasks.glue.table import GLUE
from configs import bert_base_long, default
from tests.paths import ROOT

CODE = ("bert_flax", "benchmarks", "optim")
HOLDERS = {"setup", "task", "program"}  # `<name>.config` is the run's config
METHODS = set(dir(ml_collections.ConfigDict))


def sources() -> Iterator[tuple[str, ast.Module]]:
    for package in (*CODE, "configs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text())


def config_builders() -> set[str]:
    """Functions that return a whole run config (annotated so; `*section` ones return a part)."""
    return {
        node.name
        for _, tree in sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and is_config_dict(node.returns)
        and "section" not in node.name
    }


def leaves(config: ml_collections.ConfigDict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            out |= leaves(value, f"{prefix}{key}.")
        else:
            out.add(f"{prefix}{key}")
    return out


def config_files() -> Iterator[tuple[str, ml_collections.ConfigDict]]:
    """(name, config) of every configs/ file, with each argument its get_config takes."""
    arguments = {
        "glue": [*(k for k in GLUE if k != "ax"), "rte,base"],
        "squad": ["cpu", "base"],
        "conll": ["cpu", "base"],
        "bert_base_long": list(bert_base_long.LENGTHS),
    }
    for module in pkgutil.iter_modules(configs.__path__):
        get_config = importlib.import_module(f"configs.{module.name}").get_config
        args = arguments.get(module.name)
        if args is None and get_config.__code__.co_argcount:
            args = ["phase1", "phase2"]
        for arg in args or [None]:
            name = module.name if arg is None else f"{module.name}:{arg}"
            yield name, get_config() if arg is None else get_config(arg)


@pytest.mark.parametrize(("name", "config"), list(config_files()), ids=lambda v: str(v)[:40])
def test_every_config_file_has_exactly_the_schemas_fields(name, config):
    assert leaves(config) == leaves(default.get_config()), name


def test_the_schema_is_locked_so_a_misspelt_field_is_an_error():
    config = default.get_config()
    with pytest.raises(AttributeError, match="cannot be added since the config is locked"):
        config.train.epoch = 2.0


def is_config_dict(annotation: ast.AST | None) -> bool:
    return annotation is not None and "ConfigDict" in ast.unparse(annotation)


class Reads(ast.NodeVisitor):
    """Collects (file:line, dotted field) of every field a run config's chain names, and the
    `.get("field")` calls on one."""

    def __init__(self, path: str, builders: set[str]):
        self.path, self.builders, self.fields, self.gets = path, builders, [], []
        self.scopes: list[dict[str, tuple[str, ...]]] = [{}]
        self.config_classes: list[bool] = [False]

    def root(self, node: ast.AST) -> tuple[str, ...] | None:
        """The field path `node` is, if it is a run config or a field of one."""
        if isinstance(node, ast.Name):
            for scope in reversed(self.scopes):
                if node.id in scope:
                    return scope[node.id]
            return None
        if isinstance(node, ast.Attribute) and node.attr == "config":
            value = node.value
            if isinstance(value, ast.Name):
                if value.id == "FLAGS" or value.id in HOLDERS:
                    return ()
                if value.id == "self" and self.config_classes[-1]:
                    return ()
            return None
        if isinstance(node, ast.Attribute):
            base = self.root(node.value)
            if base is None or node.attr in METHODS:
                return None
            return (*base, node.attr)
        return None

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        holds = any(
            isinstance(n, ast.AnnAssign)
            and getattr(n.target, "id", "") == "config"
            and is_config_dict(n.annotation)
            for n in node.body
        ) or any(ast.unparse(b).endswith("Task") for b in node.bases)
        for n in node.body:
            if isinstance(n, ast.FunctionDef) and n.name == "__init__":
                holds |= any(
                    a.arg == "config" and is_config_dict(a.annotation) for a in n.args.args
                )
        self.config_classes.append(holds)
        self.generic_visit(node)
        self.config_classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        scope: dict[str, tuple[str, ...]] = {}
        sections = set(default.get_config().keys())
        for arg in [*node.args.args, *node.args.kwonlyargs]:
            if is_config_dict(arg.annotation):
                if arg.arg == "config":
                    scope[arg.arg] = ()
                elif arg.arg in sections:
                    scope[arg.arg] = (arg.arg,)
        self.scopes.append(scope)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        pairs = [(t, node.value) for t in node.targets]
        if isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
            pairs = list(zip(node.targets[0].elts, node.value.elts, strict=False))
        for target, value in pairs:
            if not isinstance(target, ast.Name):
                continue
            path = self.root(value)
            if path is None and isinstance(value, ast.Call):
                func = value.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in self.builders:
                    path = ()
            if path is not None:
                self.scopes[-1][target.id] = path
            else:
                self.scopes[-1].pop(target.id, None)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        path = self.root(node)
        if path:
            self.fields.append((f"{self.path}:{node.lineno}", path))
        elif path is None:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
            base = self.root(func.value)
            if base is not None and isinstance(node.args[0], ast.Constant):
                self.gets.append((f"{self.path}:{node.lineno}", (*base, node.args[0].value)))
        self.generic_visit(node)


def resolves(path: tuple[str, ...], schema: ml_collections.ConfigDict) -> bool:
    """Whether `path` names a field of `schema` (or a value's attribute past one)."""
    node = schema
    for name in path:
        if not isinstance(node, ml_collections.ConfigDict):
            return True  # past a value: its own attributes
        if name not in node:
            return False
        node = node[name]
    return True


def code_reads() -> tuple[list, list]:
    """(where, field path) of every field read or set, and of every `.get` of one."""
    fields, gets, builders = [], [], config_builders()
    for path, tree in sources():
        if not path.startswith("configs"):
            reads = Reads(path, builders)
            reads.visit(tree)
            fields += reads.fields
            gets += reads.gets
    return fields, gets


def test_the_code_reads_only_fields_of_the_schema():
    schema = default.get_config()
    fields, _ = code_reads()
    assert len(fields) > 300  # the walk finds the reads (a broken walk finds none)
    missing = [f"{where}: config.{'.'.join(path)}" for where, path in fields]
    missing = [
        m for m, (_, path) in zip(missing, fields, strict=True) if not resolves(path, schema)
    ]
    assert not missing, "fields the schema (configs/default.py) lacks:\n" + "\n".join(missing)


def test_no_schema_field_is_read_with_a_default():
    _, gets = code_reads()
    shown = [f"{where}: .get({'.'.join(path)!r})" for where, path in gets]
    assert not shown, "read the field itself (the schema has it):\n" + "\n".join(shown)
