"""A benchmark's results on disk: its JSON document and, beside it, its Markdown page.

    document(name, rows, torch_too=True, **meta) -> dict   {"benchmark", "date", "machine",
                                                          **meta, "rows"}
    write(path, document, summarize, indent=2)             the JSON at ``path`` and the page
                                                          ``summarize(document)`` beside it
    write_document(path, document, indent=2)               the JSON alone, replaced whole (a
                                                          reader never sees half a file)
    write_json(path, name, rows, summarize, **meta) -> dict   both: the document written

Every benchmark writes through ``write``: a run always leaves ``<name>.json`` and ``<name>.md``
of the same figures.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common import machine, markdown

Summarize = Callable[[Mapping[str, Any]], markdown.Summary]


def now() -> str:
    """The time as the documents write it: UTC, ISO 8601, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def document(
    name: str, rows: list[dict[str, Any]], torch_too: bool = True, **meta: Any
) -> dict[str, Any]:
    """The document of a run; ``torch_too``: the machine's description names torch and CUDA
    (and counts torch's threads as its CPUs)."""
    return {"benchmark": name, "date": now(), "machine": machine.describe(torch_too), **meta,
            "rows": rows}  # fmt: skip


def write(path: Path, document: Mapping[str, Any], summarize: Summarize, indent: int = 2) -> None:
    write_document(path, document, indent)
    markdown.write(path, document, summarize(document))


def write_document(path: Path, document: Mapping[str, Any], indent: int = 2) -> None:
    """Values JSON cannot hold are written as their ``str``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=indent, default=str) + "\n")
    os.replace(partial, path)


def write_json(
    path: Path, name: str, rows: list[dict[str, Any]], summarize: Summarize, **meta: Any
) -> dict[str, Any]:
    written = document(name, rows, **meta)
    write(path, written, summarize)
    return written
