"""``bench/results/gpu.md``: a run of ``kvtier bench gpu`` as a Markdown table, from its JSON
(``common.markdown``, as every bench's page).

summary(document, tests=None) -> Summary   the device, the table against the goals, the null
                                      figures' reasons, the errors; ``tests``: a pytest run's
                                      summary
render(document, tests=None) -> str   the page
write(json_path, document)            the page beside the JSON
python -m kvtier.apps.bench.gpu.markdown JSON --out MD [--pytest-log LOG]
                                      what ``make test-gpu`` runs after the tests and the
                                      bench (a JSON that is missing or unreadable is said so)
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common import markdown
from kvtier.apps.bench.common.markdown import Summary
from kvtier.apps.bench.gpu.advice import advise
from kvtier.apps.bench.gpu.figures import rows

COUNTED = ("passed", "failed", "skipped", "errors", "error", "xfailed", "xpassed", "deselected")


def summary(document: Mapping[str, Any], tests: str | None = None) -> Summary:
    facts = [("device", str(document.get("device", "unknown")))]
    if tests is not None:
        facts.append(("`pytest tests/gpu`", tests))
    if "quick" in document:
        run = (f"{'--quick, ' if document['quick'] else ''}{document.get('reps')} reps, "
               f"{document.get('tokens')} tokens, {document.get('runtime_s', '?')} s; torch "
               f"{document.get('torch')}")  # fmt: skip
        facts.append(("`kvtier bench gpu`", run))
    if document.get("default_mechanism"):
        facts.append(("an engine's mechanism (`KVTIER_GPU_COPY`)", document["default_mechanism"]))
    advice = advise(document)
    if advice is not None:
        facts.append(("advised for this GPU", f"`KVTIER_GPU_COPY={advice.value}`"))
    table, nulls = [], []
    for row in rows(document):
        goal = "-" if row["goal"] is None else f"{row['how']} {row['goal']}"
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        if row["median"] is None:
            nulls.append(f"- {row['shape']} {row['figure']}: {row['why']}")
        table.append((row["shape"], row["figure"], row["mechanism"], _cell(row["median"]),
                      _cell(row["min"]), _cell(row["max"]), goal, met))  # fmt: skip
    notes = [f"- pinning: {_pinning(document)}", *_disk_readers(document), *_launches(document)]
    if advice is not None:
        notes += [f"- {side}s by {c.mechanism.value}: {c.why}" for side, c in
                  zip(("store", "load"), advice, strict=True)]  # fmt: skip
    if nulls:
        notes += ["", "Null figures:", "", *nulls]
    errors = document.get("errors", [])
    if errors:
        notes += ["", "Errors:", ""]
        notes += [f"- {e['shape']} {e['measure']}: {e['error']}" for e in errors]
    return Summary("kvtier on a GPU", _command(document),
                   ("shape", "figure", "mechanism", "median", "min", "max", "goal", "met"), table,
                   tuple(facts), tuple(notes))  # fmt: skip


def render(document: Mapping[str, Any], tests: str | None = None) -> str:
    return markdown.render(document, summary(document, tests), "gpu.json")


def write(json_path: Path, document: Mapping[str, Any]) -> Path:
    return markdown.write(json_path, document, summary(document))


def _command(document: Mapping[str, Any]) -> str:
    argv = [str(a) for a in document.get("argv", [])]
    if argv[:2] == ["bench", "gpu"]:
        return "kvtier " + shlex.join(argv)
    quick = " --quick" if document.get("quick") else ""
    return (
        f"kvtier bench gpu{quick} --reps {document.get('reps')} --tokens {document.get('tokens')}"
    )


def _cell(value: float | None) -> str:
    return "null" if value is None else f"{value:.3g}"


def _pinning(document: Mapping[str, Any]) -> str:
    rate = document.get("pinning_rate_bytes_s")
    if rate is None:
        return "null: " + str(document.get("why_null", {}).get("pinning_rate_bytes_s"))
    held = document.get("pinning_engine_held_s")
    return f"{rate / 1e9:.2f} GB/s; the engine's thread held {held} s"


def _disk_readers(document: Mapping[str, Any]) -> list[str]:
    """Per shape whose disk loads read several files at once: the ratios of one at a time."""
    lines = []
    for name, shape in document.get("shapes", {}).items():
        disk = (shape.get("details") or {}).get("disk") or {}
        one = disk.get("one_reader_ratio")
        if one:
            lines.append(f"- {name} disk: {disk.get('readers')} files read at once; one at a "
                         f"time, median ratio warm {_cell(one['warm']['median'])}, cold "
                         f"{_cell(one['cold']['median'])}")  # fmt: skip
        ceiling, checked = disk.get("checksum_ceiling"), disk.get("checked_ratio")
        if ceiling and checked:
            lines.append(f"- {name} disk: reads that hash every piece reach, median, warm "
                         f"{_cell(ceiling['warm']['median'])}, cold "
                         f"{_cell(ceiling['cold']['median'])} of the bound; kvtier's loads "
                         f"{_cell(checked['warm']['median'])}, {_cell(checked['cold']['median'])}"
                         " of those")  # fmt: skip
        for variant, done in (disk.get("variants") or {}).items():
            ratio = done["ratio"]
            lines.append(f"- {name} disk: {variant} ({done['readers']} readers, halves of "
                         f"{done['stage_bytes'] >> 20} MiB): kvtier's time over its own, median, "
                         f"warm {_cell(ratio['warm']['median'])}, cold "
                         f"{_cell(ratio['cold']['median'])}")  # fmt: skip
        reads = disk.get("reads_ratio")
        if reads:
            lines.append(f"- {name} disk: kvtier's reads alone, nothing moved, median ratio warm "
                         f"{_cell(reads['warm']['median'])}, cold "
                         f"{_cell(reads['cold']['median'])}")  # fmt: skip
    return lines


def _launches(document: Mapping[str, Any]) -> list[str]:
    """Per shape whose grid kernel launches were timed: the chosen one's ratios (the device
    alone), the fastest each way, and any launch that moved other bytes."""
    lines = []
    for name, shape in document.get("shapes", {}).items():
        sweep = (shape.get("details") or {}).get("launches") or {}
        rows = {_launch(row["launch"]): row for row in sweep.get("launches", [])}
        chosen = rows.get(_launch(sweep.get("chosen") or {}))
        if chosen is None or "store" not in chosen:
            continue
        fastest = [f"{side} {_launch(launch)} {_cell(rows[_launch(launch)][side]['median'])}"
                   for side, launch in sweep.get("fastest", {}).items()]  # fmt: skip
        lines.append(f"- {name} grid kernel, pages of {sweep.get('page_bytes')} bytes, on the "
                     f"device alone, median: {_launch(sweep['chosen'])} (chosen) store "
                     f"{_cell(chosen['store']['median'])}, load {_cell(chosen['load']['median'])};"
                     f" fastest: {'; '.join(fastest)}")  # fmt: skip
        lines += [f"- {name} grid kernel: {text} moved other bytes than the request's"
                  for text, row in rows.items() if row.get("intact") is False]  # fmt: skip
    return lines


def _launch(launch: Mapping[str, Any]) -> str:
    return (
        f"{launch.get('pages')} page(s) a step of {launch.get('block')} words, "
        f"{launch.get('warps')} warps, {launch.get('programs')} programs"
    )


def pytest_summary(log: str) -> str:
    """``"12 passed, 3 skipped"`` from pytest's output (its last summary line), or what the log
    ends with when it has none (a crash)."""
    for line in reversed(log.strip().splitlines()):
        counts = re.findall(r"(\d+) (" + "|".join(COUNTED) + r")\b", line)
        if counts or "no tests ran" in line:
            took = re.search(r" in ([\d.]+s)", line)
            text = ", ".join(f"{n} {what}" for n, what in counts) or "no tests ran"
            return text + (f" in {took.group(1)}" if took else "")
    tail = log.strip().splitlines()[-1:] or ["no output"]
    return f"no summary line (the log ends: {tail[0][:200]!r})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtier.apps.bench.gpu.markdown")
    parser.add_argument("json", type=Path, help="bench/results/gpu.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pytest-log", type=Path, default=None, help="pytest's output")
    args = parser.parse_args(argv)
    try:
        document: dict[str, Any] = json.loads(args.json.read_text())
    except (OSError, ValueError) as error:
        document = {"device": _device(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                    time.gmtime()), "errors": [{"shape": None, "measure": "bench gpu",
                    "error": f"no results: {args.json}: {error}"}]}  # fmt: skip
    tests = None
    if args.pytest_log is not None:
        try:
            tests = pytest_summary(args.pytest_log.read_text(errors="replace"))
        except OSError as error:
            tests = f"no log: {error}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown.render(document, summary(document, tests), args.json.name))
    print(f"wrote {args.out}")
    return 0


def _device() -> str:
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    except Exception as error:  # torch absent or broken: the report still gets written
        return f"unknown ({type(error).__name__})"


if __name__ == "__main__":
    raise SystemExit(main())
