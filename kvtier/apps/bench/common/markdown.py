"""A benchmark's latest figures as Markdown, next to its JSON: ``bench/results/<name>.md``.

    Summary(title, command, columns, rows, facts=(), notes=())   what a bench says of one run
    render(document, summary, source)  -> str    the page: title; date, machine, command, the
                                                 JSON it came from, more facts; the table; notes
    write(json_path, document, summary)           the page beside ``json_path`` (``.md``)
    cell(value, digits)                -> str    a number as a table shows it (None: "-")

Every bench builds its ``Summary`` from its JSON document alone (``<family>/report.py``:
``summary(document)``), so that the page can be made again from the file (``kvtier bench
report``). The date and the machine are the document's (``"not recorded"`` when it has none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kvtier.apps.bench.common.machine import one_line


class Summary(NamedTuple):
    title: str  # "kvtier bench ttft"
    command: str  # the command line that reproduces the run
    columns: tuple[str, ...]
    rows: Sequence[Sequence[str]]  # formatted cells, one per column
    facts: tuple[tuple[str, str], ...] = ()  # more "- name: value" lines, after the command
    notes: tuple[str, ...] = ()  # lines after the table


def render(document: Mapping[str, Any], summary: Summary, source: str) -> str:
    lines = [f"# {summary.title}", ""]
    lines += [f"- date: {document.get('date', 'not recorded')}",
              f"- machine: {one_line(document.get('machine'))}",
              f"- command: `{summary.command}`", f"- results: `{source}`"]  # fmt: skip
    lines += [f"- {name}: {value}" for name, value in summary.facts]
    lines += ["", "| " + " | ".join(summary.columns) + " |",
              "|" + "---|" * len(summary.columns)]  # fmt: skip
    for row in summary.rows:
        if len(row) != len(summary.columns):
            raise ValueError(f"a row of {len(row)} cells under {len(summary.columns)} columns")
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    if summary.notes:
        lines += ["", *summary.notes]
    return "\n".join(lines) + "\n"


def write(json_path: Path, document: Mapping[str, Any], summary: Summary) -> Path:
    """Write ``render(...)`` to ``json_path`` with the suffix ``.md``; its path."""
    path = json_path.with_suffix(".md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(document, summary, json_path.name))
    return path


def cell(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def verdict(passed: bool | None) -> str:
    """A goal's verdict in a table: "PASS", "**FAIL**" or "-" (no goal)."""
    return {True: "PASS", False: "**FAIL**", None: "-"}[passed]
