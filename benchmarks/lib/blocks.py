r"""Figures in the docs rendered from the published results files, so that no doc can drift from
the run that measured it.

    python -m benchmarks --docs     # rewrites every marked block in README.md and docs/
    python -m benchmarks --check    # names the blocks that differ from their files

A doc marks a block with `<!-- results:NAME -->` and `<!-- /results -->`. Each benchmark renders
its own blocks: its module's `BLOCKS` maps NAME to a function of the results files (markdown),
and `README_ROW` is its row of the README's headline table; `RENDERERS` names the modules. To
change a figure, rerun its benchmark (it rewrites its file) and run `--docs`; text around a
block says what the block shows, it does not restate its figures.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
from collections.abc import Callable

from benchmarks.lib.records import PUBLISHED, Read, read
from benchmarks.lib.render import table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK = re.compile(r"(<!-- results:(\w+)[^\n]*-->\n)(.*?)(<!-- /results -->)", re.S)


# The modules whose blocks the docs show, in the order of their rows in the README's table.
RENDERERS = (
    "packing_bench",
    "packed_vs_padded",
    "studies.time_to_accuracy",
    "lib.runs",
    "studies.learning_curves",
    "studies.finetune_packed_vs_padded",
    "studies.label_efficiency",
    "studies.squad_packed_vs_padded",
    "studies.finetune_suite",
    "profile_report",
    "compile_table",
    "studies.attention_dropout",
    "block_sparse_bench",
    "studies.block_sparse_learning",
    "pipeline_bench",
    "prepare_bench",
    "model_bench",
    "step_cost",
    "studies.optimizer_race",
    "loss_bench",
)
MODULES = [importlib.import_module(f"benchmarks.{name}") for name in RENDERERS]
README_ROWS = [module.README_ROW for module in MODULES if hasattr(module, "README_ROW")]


def readme_table(read: Read) -> str:
    """The README's table of headline results."""
    return table(
        ["result", "figure", "command (details)"],
        [[*render(read), command] for render, command in README_ROWS],
    )


BLOCKS: dict[str, Callable[[Read], str]] = {"readme": readme_table}
for module in MODULES:
    BLOCKS.update(module.BLOCKS)


def published(name: str) -> dict:
    return read(name, PUBLISHED)


def doc_paths() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def render(text: str, path: str, read: Read = published) -> tuple[str, list[str]]:
    """`text` with every block rendered afresh, and the names of the blocks that changed."""
    changed = []

    def block(match: re.Match) -> str:
        opening, name, old, closing = match.groups()
        if name not in BLOCKS:
            raise ValueError(f"{path}: no block named {name!r}; the names are {sorted(BLOCKS)}")
        new = "\n" + BLOCKS[name](read) + "\n\n"
        if new != old:
            changed.append(name)
        return opening + new + closing

    return BLOCK.sub(block, text), changed


def update_docs(write: bool) -> list[tuple[str, str]]:
    """(doc, block) for every block that differs from its rendering; with `write`, rewritten."""
    changed = []
    for path in doc_paths():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new, names = render(text, path)
        changed += [(os.path.relpath(path, ROOT), name) for name in names]
        if write and names:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
    return changed
