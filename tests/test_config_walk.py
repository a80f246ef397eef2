"""How far the run's config travels: from the training entry point, follow depth-first every call
to a project function that is handed the config (or a field of it), and count the moves between
modules. A move to a module the walk has already been in is a move back up; a reader following
the config climbs back that often. The walk is static (the AST): top-level functions and classes
resolved through each module's imports (and re-exports), each function walked once."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

from tests.paths import ROOT

ENTRY = ("bert_flax.train.__main__", "main")
MAX_BACK_UPS = 8  # issue 57's bound


def module_path(module: str) -> pathlib.Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


@dataclasses.dataclass
class Module:
    functions: dict[str, ast.FunctionDef | None]  # a class: its __init__ (None: generated)
    names: dict[str, tuple[str, str | None]]  # local name -> (module, attribute or None)


def parse(module: str, cache: dict[str, Module]) -> Module:
    if module in cache:
        return cache[module]
    tree = ast.parse(module_path(module).read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            init = [n for n in node.body if getattr(n, "name", None) == "__init__"]
            functions[node.name] = init[0] if init else None
    names: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                target = (sub, None) if module_path(sub) else (node.module, alias.name)
                names[alias.asname or alias.name] = target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
    cache[module] = Module(functions, names)
    return cache[module]


def mentions(node: ast.AST, carriers: set[str]) -> bool:
    """Whether `node` is the config or a field of it: a name that holds it, or `x.config`, with
    attributes and subscripts after (`config.mesh.shape`, `FLAGS.config`, `self.config`)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr == "config":
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id in carriers


def resolve(call: ast.Call, module: str, cache: dict[str, Module]) -> tuple[str, str] | None:
    """(module, name) of a call to a project function or class, else None; a name a package
    re-exports is followed to the module that defines it."""
    func, parsed = call.func, parse(module, cache)
    if isinstance(func, ast.Name):
        target = (module, func.id) if func.id in parsed.functions else parsed.names.get(func.id)
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        imported = parsed.names.get(func.value.id)
        target = (imported[0], func.attr) if imported and imported[1] is None else None
    else:
        target = None
    while target and target[1] and module_path(target[0]):
        defined = parse(target[0], cache)
        if target[1] in defined.functions:
            return target
        target = defined.names.get(target[1])
    return None


def receivers(function: ast.FunctionDef | None, call: ast.Call, carriers: set[str]) -> set[str]:
    """The callee's parameters that the call hands the config to."""
    if function is None:
        return set()
    params = [a.arg for a in function.args.posonlyargs + function.args.args]
    params = params[1:] if function.name == "__init__" else params
    names = {
        params[i] for i, arg in enumerate(call.args) if i < len(params) and mentions(arg, carriers)
    }
    return names | {k.arg for k in call.keywords if k.arg and mentions(k.value, carriers)}


def _position(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset


def walk() -> list[str]:
    """The modules in the order the walk is in them (consecutive repeats dropped)."""
    cache: dict[str, Module] = {}
    seen: set[tuple[str, str]] = set()
    path: list[str] = []

    def visit(module: str, name: str, carriers: set[str]) -> None:
        seen.add((module, name))
        if not path or path[-1] != module:
            path.append(module)
        function = parse(module, cache).functions[name]
        calls = [] if function is None else ast.walk(function)
        in_order = sorted((n for n in calls if isinstance(n, ast.Call)), key=_position)
        for call in in_order:
            if not any(mentions(a, carriers) for a in call.args + [k.value for k in call.keywords]):
                continue
            target = resolve(call, module, cache)
            if target is None or target in seen:
                continue
            visit(*target, receivers(parse(target[0], cache).functions[target[1]], call, carriers))
            if path[-1] != module:
                path.append(module)

    visit(*ENTRY, {"config"})
    return path


def back_ups(path: list[str]) -> int:
    return sum(module in path[:i] for i, module in enumerate(path) if i)


def test_the_config_climbs_back_up_at_most_eight_times():
    path = walk()
    assert len(path) > 4, f"the walk found almost nothing: {path}"
    assert back_ups(path) <= MAX_BACK_UPS, (
        f"following config from {'.'.join(ENTRY)} climbs back up {back_ups(path)} times "
        f"(at most {MAX_BACK_UPS}): {' -> '.join(m.removeprefix('bert_flax.') for m in path)}"
    )


def test_a_back_up_is_a_move_to_a_module_already_left():
    assert back_ups(["a", "b", "a", "c", "a"]) == 2
    assert back_ups(["a", "b", "c"]) == 0


if __name__ == "__main__":
    route = walk()
    print(" -> ".join(route))
    print(f"{len(set(route))} modules, {len(route) - 1} moves, {back_ups(route)} back up")
