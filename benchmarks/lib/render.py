"""What the benchmarks' blocks are written with: markdown tables, figures' formats, and the line
that names where a block's figures come from."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.lib.records import Read


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def times(value: float) -> str:
    return f"{value:.2f}x"


def points(gain: float) -> str:
    return f"{100 * gain:+.1f}"


def share(value: float) -> str:
    return f"{100 * value:.1f}%"


def machine_text(machine: dict) -> str:
    """The machine a result was measured on, as a results file records it."""
    return ", ".join(
        str(machine[key]) + (" cores" if key == "cores" else "")
        for key in ("cpu", "cores", "load")
        if machine.get(key)
    )


def runs(name: str, read: Read) -> list[dict]:
    """Every run a results file records, oldest first: its `earlier_runs`, then its own."""
    record = read(name)
    return [*record.get("earlier_runs", []), record]


def run_sources(name: str, read: Read) -> list[str]:
    """The `source` line of each of the file's `runs`, in their order (oldest first)."""
    earlier = range(len(read(name).get("earlier_runs", [])))
    return [*(source(name, read, i) for i in earlier), source(name, read)]


def source(name: str, read: Read, earlier: int | None = None) -> str:
    """Where a block's figures come from: the file, its command, date, machine and commit (of
    its run `earlier_runs[earlier]`, when given)."""
    record = read(name)
    label = f"`benchmarks/results/{name}.json`"
    if earlier is not None:
        record, label = record["earlier_runs"][earlier], label + ", an earlier run"
    where = machine_text(record["machine"])
    date = record["date"] or "date not recorded"
    commit = record["commit"] if record["commit"] == "unknown" else record["commit"][:10]
    commit += "+dirty" if record["commit"].endswith("+dirty") else ""
    line = f"{label}: `{record['command']}` ({date}; {where}; commit {commit})"
    if record.get("provenance"):
        line += f". {record['provenance']}"
    return line


Columns = dict[str, Callable[[dict], object]]  # header -> the cell of an item


def items_table(items: list[dict], columns: Columns) -> str:
    """A markdown table of `items`, one row each, cells from `columns`."""
    return table(list(columns), [[cell(item) for cell in columns.values()] for item in items])


def whole(value: float) -> str:
    return f"{value:,.0f}"


def mb(value: float) -> str:
    return f"{value:,.0f} MB"


def plus_minus(ratio: float, relative_error: float, digits: int = 2) -> str:
    """A ratio and its standard error (recorded relative, shown absolute)."""
    return f"{ratio:.{digits}f} ± {ratio * relative_error:.{digits}f}"


def either(value: object, spec: str) -> str:
    """`value` formatted, "-" where a file does not record it."""
    return "-" if value is None else format(value, spec)
