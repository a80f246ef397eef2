"""The import layers (docs/design.md, "The map"): a module imports only from its own layer or
below, and no modules import each other in a circle, deferred imports included. Type-only imports
(`if TYPE_CHECKING:`) are exempt: they name a type, nothing runs. The layers are read from the
map's table, so the map and the tree cannot drift apart."""

from __future__ import annotations

import ast
import os
import pathlib
import re

import pytest

from tests.paths import ROOT

PACKAGES = ("packing", "optim", "bert_flax", "configs", "benchmarks")


def map_layers(design: str) -> list[tuple[str, ...]]:
    """Bottom to top, the module names of each row of design.md's map (`bert_flax/model/` ->
    `bert_flax.model`; `__main__.py` stands for every package's `__main__`)."""
    layers = []
    for line in design.split("## The map", 1)[1].splitlines():
        row = re.match(r"\| (\d+) \| ([^|]*) \|", line)
        if row:
            assert int(row[1]) == len(layers), f"the map's layer {row[1]} is out of order"
            paths = re.findall(r"`([^`]+)`", row[2])
            layers.append(tuple(p.removesuffix(".py").strip("/").replace("/", ".") for p in paths))
    return layers


LAYERS = map_layers((ROOT / "docs" / "design.md").read_text())


def module_files() -> dict[str, pathlib.Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


MODULES = module_files()


def layer(module: str) -> int:
    for index, names in reversed(list(enumerate(LAYERS))):
        if module.endswith(".__main__") and "__main__" in names:
            return index
        if any(module == n or module.startswith(n + ".") for n in names):
            return index
    raise AssertionError(f"{module} is in no layer of the map: add it to docs/design.md.")


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {
                id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))
            }
    return skipped


def imports(module: str) -> set[str]:
    """The project's modules `module` imports, anywhere in it (deferred ones too)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found, skipped = set(), _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        found |= {n for n in names if n in MODULES and n != module}
    return found


GRAPH = {module: imports(module) for module in MODULES}


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_the_kernels_import_no_layer_that_calls_them():
    """`kernels/` shares layer 3 with `block_sparse/` and sits below it: no kernel imports the
    block-sparse layers (their layout is a type-only import)."""
    upward = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module.startswith("bert_flax.kernels")
        for target in sorted(targets)
        if target.startswith("bert_flax.block_sparse")
    ]
    assert not upward, "\n".join(upward)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle():
    assert not cycles(GRAPH), cycles(GRAPH)


@pytest.mark.parametrize(
    "graph, circles",
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_cycles_finds_exactly_the_circles(graph, circles):
    assert cycles(graph) == circles


def test_the_map_names_only_what_the_tree_holds():
    named = {n for names in LAYERS for n in names} - {"__main__"}
    assert not named - set(MODULES), f"the map names what the tree lacks: {named - set(MODULES)}"
    modules = ("packing.api", "bert_flax.train.loop", "bert_flax.aot.__main__", "benchmarks.lib")
    assert [layer(m) for m in modules] == [0, 9, 12, 13]


def test_the_input_pipeline_sits_below_the_preparation():
    """Preparation writes the format the input pipeline reads (`records`), never the reverse."""
    assert layer("bert_flax.input_pipeline.records") < layer("bert_flax.data.stages")


def _bound(path: pathlib.Path) -> set[str]:
    """Every name a module binds anywhere (definitions, assignments, imports)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def test_an_import_from_a_package_names_its_module_or_what_it_binds():
    """`from package import name` where name is no module of the package and nothing its
    `__init__` binds (a module moved away) would fail only when run: deferred, not at all."""
    missing = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in MODULES:
                continue
            package = MODULES[node.module]
            if package.name != "__init__.py":
                continue
            bound = _bound(package)
            missing += [
                f"{module}: from {node.module} import {alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" not in MODULES and alias.name not in bound
            ]
    assert not missing, "\n".join(missing)


def test_every_module_of_the_project_is_seen():
    assert {"bert_flax.train.loop", "bert_flax.model.bert", "packing.api", "optim.shampoo"} <= set(
        MODULES
    )
    assert GRAPH["bert_flax.train.loop"] >= {"bert_flax.train.setup", "bert_flax.runs.metrics"}
    assert os.path.basename(MODULES["bert_flax.model"]) == "__init__.py"
