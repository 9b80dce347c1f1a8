"""``kvtier bench report``: every benchmark JSON in a folder given its Markdown page again.

    SUMMARIES                      benchmark name -> the module whose ``summary(document)``
                                   makes its page (the name a document's ``"benchmark"`` holds,
                                   else its file's stem)
    page(json_path)    -> Path     the page beside one JSON file, made from it alone
    COMMAND                        ``kvtier bench report [--out DIR]``

A benchmark writes its page itself on every run (``common.results.write``); this makes the pages
of results written before, or after a change of the pages' shape.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from kvtier.apps.command import Command

SUMMARIES = {
    "copy": "kvtier.apps.bench.copy.report",
    "ttft": "kvtier.apps.bench.ttft.report",
    "disk": "kvtier.apps.bench.disk.report",
    "transfer": "kvtier.apps.bench.transfer.report",
    "transfer-ttft": "kvtier.apps.bench.transfer.ttft_report",
    "redis": "kvtier.apps.bench.redis.report",
    "faults": "kvtier.apps.bench.faults.report",
    "scheduler": "kvtier.apps.bench.scheduler.report",
    "concurrency": "kvtier.apps.bench.concurrency.report",
    "fleet": "kvtier.apps.bench.fleet.real.report",
    "fleet-sim": "kvtier.apps.bench.fleet.sim.report",
    "chaos": "kvtier.apps.bench.chaos.report",
    "gpu": "kvtier.apps.bench.gpu.markdown",
}


def page(json_path: Path) -> Path:
    """``ValueError`` naming the known benchmarks when the file is none of theirs."""
    from kvtier.apps.bench.common import markdown

    document = json.loads(json_path.read_text())
    name = document.get("benchmark", json_path.stem)
    if name not in SUMMARIES:
        raise ValueError(f"{json_path}: benchmark {name!r} is none of {', '.join(SUMMARIES)}")
    summary = importlib.import_module(SUMMARIES[name]).summary(document)
    return markdown.write(json_path, document, summary)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("bench/results"),
                        help="the folder of the benchmarks' JSON files")  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    status = 0
    for path in sorted(args.out.glob("*.json")):
        try:
            print(f"wrote {page(path)}")
        except (ValueError, KeyError, TypeError) as error:  # a file the pages cannot read
            print(f"kvtier bench report: {path}: {type(error).__name__}: {error}", file=sys.stderr)
            status = 1
    return status


COMMAND = Command(
    "report",
    "every benchmark JSON's Markdown page, made again from the file",
    _arguments,
    _run,
    description="For each <name>.json under --out written by a kvtier benchmark, write "
    "<name>.md beside it: the run's date, machine and command, and its figures as a table "
    "(what the benchmark itself writes after every run).",
)
