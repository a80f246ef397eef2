"""`key.path=value` overrides of a ConfigDict, as `--config.key.path=value` flags give them.

The command line (`ml_collections.config_flags`) and the profiler's sweeps share this syntax and
its parsing (by the field's type: bool, int, float, str, tuple); a key the config does not have
is an error naming the keys that exist where it went wrong:

    set_value(config, "model.num_layers", "2")
    check_key(config, "model.num_layer")   # KeyError: ... valid keys of config.model: ...

`flags_parser("config")` is an `app.run(main, flags_parser=...)` parser that checks every
`--config.*` key before absl parses the flags (whose own error is a bare AttributeError).
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections
from absl import app, flags
from ml_collections.config_flags import config_path, tuple_parser

_PARSERS = {
    bool: flags.BooleanParser(),
    int: flags.IntegerParser(),
    float: flags.FloatParser(),
    tuple: tuple_parser.TupleParser(),
}


def check_key(config: ml_collections.ConfigDict, key: str, *, what: str = "config") -> None:
    """Raises KeyError unless `key` (dotted) names a field or section of `config`."""
    node, walked = config, what
    for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            valid = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
            raise KeyError(
                f"{what}.{key}: {walked} has no field {part!r}; valid keys of {walked}: {valid}."
            )
        node, walked = node[part], f"{walked}.{part}"


def parse_value(config: ml_collections.ConfigDict, key: str, text: str) -> Any:
    """`text` parsed to the type of field `key` (placeholders have a declared type)."""
    check_key(config, key)
    kind = config_path.normalize_type(config_path.get_type(key, config))
    parser = _PARSERS.get(kind)
    if parser is not None:
        return parser.parse(text)
    return text if kind is str else _literal(text)


def set_value(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    """`config.<key> = text`, parsed to the field's type."""
    config_path.set_value(key, config, parse_value(config, key, text))


def _literal(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """What `--config=path[:argument]` loads: `get_config(argument)` of the file at `path`."""
    path, sep, argument = spec.partition(":")
    get_config = runpy.run_path(path)["get_config"]
    return get_config(argument) if sep else get_config()


def _config_spec(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def override_keys(argv: Sequence[str], name: str = "config") -> list[str]:
    """The `KEY` of every `--name.KEY[=VALUE]` (and `--noname.KEY`) argument."""
    keys = []
    for arg in argv:
        for prefix in (f"--{name}.", f"--no{name}."):
            if arg.startswith(prefix):
                keys.append(arg[len(prefix) :].split("=", 1)[0])
    return keys


def flags_parser(name: str = "config") -> Callable[[list[str]], list[str]]:
    """An absl flags parser that first checks the `--name.*` override keys against the config
    file, so a typo is a one-line error naming the valid keys."""

    def parse(argv: list[str]) -> list[str]:
        spec, keys = _config_spec(argv, name), override_keys(argv, name)
        if spec and keys:
            config = load_config_file(spec)
            for key in keys:
                try:
                    check_key(config, key, what=f"--{name}")
                except KeyError as error:
                    sys.stderr.write(f"FATAL Flags parsing error: {error.args[0]}\n")
                    sys.exit(1)
        return app.parse_flags_with_usage(argv)

    return parse
