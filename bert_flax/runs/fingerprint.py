"""A run's fingerprint: what made it, kept beside it (`FINGERPRINT_FILE`) so that a driver reuses
a finished run only when it is the same run (`bert_flax.runs.finished.reusable_run`).

Its components, compared one by one so that a mismatch can say which differs:
- `config`: a digest of the config as given to `train_and_evaluate` (sorted JSON; the flat
  values are kept too, `config_values`, to name the keys that differ);
- `data`: the task's `identity()` (prepared data: a digest of its summary.json; synthetic rows:
  "synthetic:<length>"; a classification set: a digest of its sizes and vocabulary);
- `code`: a digest of the sources of bert_flax/, packing/, optim/ and configs/ (no git needed);
- `init_from` (only when `config.init_from` is a run with a fingerprint): that run's.

    expected = fingerprint.of_run(config, task)
    fingerprint.differences(fingerprint.load(workdir), expected)   # [] when the same run
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import ml_collections

if TYPE_CHECKING:
    from bert_flax.tasks import Task

FINGERPRINT_FILE = "fingerprint.json"
CODE_PACKAGES = ("bert_flax", "packing", "optim", "configs")
CODE_SUFFIXES = (".py", ".cc")
VALUES = "config_values"  # the flat config, kept to name the keys that differ
SHOWN_KEYS = 5  # differing config keys a message names at most


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def source_files() -> Iterator[tuple[str, str]]:
    """(name relative to the packages' folder, path) of each `CODE_SUFFIXES` file of
    `CODE_PACKAGES`, in a fixed order."""
    for package in CODE_PACKAGES:
        for root in importlib.util.find_spec(package).submodule_search_locations:
            for folder, dirs, files in os.walk(root):
                dirs.sort()
                for name in sorted(f for f in files if f.endswith(CODE_SUFFIXES)):
                    path = os.path.join(folder, name)
                    yield f"{package}/{os.path.relpath(path, root)}", path


@functools.cache
def code_version() -> str:
    """A digest of the code's sources (`source_files`: names and contents), computed once per
    process."""
    sha = hashlib.sha256()
    for name, path in source_files():
        with open(path, "rb") as f:
            sha.update(name.encode() + b"\0" + f.read())
    return sha.hexdigest()[:16]


def config_values(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The config as flat JSON values keyed by dotted name ("schedule.learning_rate")."""
    nested = json.loads(config.copy_and_resolve_references().to_json_best_effort())

    def flat(node: dict[str, Any], prefix: str) -> dict[str, Any]:
        out = {}
        for key, value in node.items():
            if isinstance(value, dict) and value:
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    return flat(nested, "")


def of_run(config: ml_collections.ConfigDict, task: Task) -> dict[str, Any]:
    """The fingerprint of a run of `config` and `task` with this code."""
    values = config_values(config)
    result = {
        "config": digest(json.dumps(values, sort_keys=True)),
        "data": task.identity(),
        "code": code_version(),
        VALUES: values,
    }
    init_from = config.init_from
    if init_from and os.path.isfile(os.path.join(init_from, FINGERPRINT_FILE)):
        with open(os.path.join(init_from, FINGERPRINT_FILE)) as f:
            result["init_from"] = digest(f.read())
    return result


def write(workdir: str, fingerprint: dict[str, Any]) -> None:
    with open(os.path.join(workdir, FINGERPRINT_FILE), "w") as f:
        json.dump(fingerprint, f, indent=2)


def load(workdir: str) -> dict[str, Any] | None:
    """The fingerprint `workdir`'s run was started with (None: none, e.g. an older run)."""
    path = os.path.join(workdir, FINGERPRINT_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def differences(stored: dict[str, Any] | None, expected: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, one phrase per component ([] when the same run);
    the config's phrase names its first differing keys."""
    if stored is None:
        return [f"no {FINGERPRINT_FILE} (a run from before runs were fingerprinted)"]
    out = []
    for component in sorted((set(stored) | set(expected)) - {VALUES}):
        old, new = stored.get(component), expected.get(component)
        if old == new:
            continue
        if component == "config":
            out.append(f"config ({config_changes(stored.get(VALUES, {}), expected[VALUES])})")
        else:
            out.append(f"{component} ({old} -> {new})")
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The first `SHOWN_KEYS` keys whose values differ, with both values."""
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:SHOWN_KEYS])
    return shown + (f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else "")
