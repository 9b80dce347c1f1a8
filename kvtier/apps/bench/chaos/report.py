"""A chaos run's report: printed, as a PNG timeline, as its Markdown page.

report(document)             the counts, TTFT per phase, the share per fault, the verdicts
plot(document, path)         faults as shaded bands; TTFT and failures over time; each
                             server's RSS over time
summary(document) -> Summary ``chaos.md``: the verdicts and the counts, the faults' timeline
command(settings)  -> str    the command line that reproduces the run
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary, cell, verdict

COLORS = {
    "engine-kill": "tab:red",
    "engine-stop": "tab:orange",
    "redis-kill": "tab:purple",
    "redis-stop": "tab:pink",
    "proxy-restart": "tab:blue",
    "host-reset": "tab:green",
}
MIB = 1 << 20


def command(settings: Mapping[str, Any]) -> str:
    line = (f"kvtier bench chaos --engines {settings['engines']} --minutes {settings['minutes']:g}"
            f" --seed {settings['seed']} --rate {settings['rate']:g}")  # fmt: skip
    if settings["every_kind_once"]:
        line += " --quick"
    return line + ("" if settings["pd"] else " --no-pd")


def _value(value: Any) -> str:
    return cell(value) if isinstance(value, (int, float)) or value is None else str(value)


def _figures(found: Mapping[str, Any]) -> list[tuple[str, ...]]:
    n, same = found["counts"], found["answers"]
    causes = ", ".join(f"{k} {v}" for k, v in sorted(n["failed_by_cause"].items())) or "none"
    return [
        ("requests sent", cell(n["sent"])),
        ("answered", cell(n["answered"])),
        ("failed (by cause)", f"{n['failed']} ({causes})"),
        ("of them streaming at an engine's kill", cell(n["failed_streaming_at_kill"])),
        ("reconnects (refused, sent again)", cell(n["reconnects"])),
        ("answers identical / different", f"{same['identical']} / {same['different']}"),
        ("past their timeout", cell(n["past_timeout"])),
        ("steady share served from kvtier", _value(found["share"]["steady"])),
    ]


def _ttft_rows(found: Mapping[str, Any]) -> list[tuple[str, ...]]:
    ttft = found["ttft"]
    rows = [("steady", ttft["steady"]), ("during a fault", ttft["during"])]
    rows += [(f"during {k}", v) for k, v in ttft["during_by_kind"].items()]
    rows += [(f"after {k}", v) for k, v in ttft["after_by_kind"].items()]
    return [(name, cell(f["count"]), _value(f["p50_s"]), _value(f["p99_s"])) for name, f in rows]


def _fault_rows(found: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for event, share in zip(found["faults"], found["share"]["faults"], strict=True):
        rows.append((event["kind"], event["target"], f"{event['start_s']:.1f}",
                     f"{event['end_s']:.1f}", _value(share["share_before"]),
                     _value(share["share_after"]), _value(share["recovered_s"]),
                     "" if event["done"] else f"not done: {event['note']}"))  # fmt: skip
    return rows


def report(found: Mapping[str, Any]) -> None:
    console = Console(width=120)
    sections: list[tuple[str, tuple[str, ...], list[tuple[str, ...]]]] = [
        ("kvtier bench chaos: " + command(found["settings"]), ("figure", "value"), _figures(found)),
        ("time to first token by phase (s)", ("phase", "answers", "p50", "p99"),
         _ttft_rows(found)),
        ("faults (s on the run's clock); kvtier's served share", ("kind", "target", "start",
         "end", "share before", "share after", "back within 10 % (s)", "note"),
         _fault_rows(found)),
        ("memory growth after warm-up", ("server", "growth"),
         [(k, _value(v)) for k, v in sorted(found["memory"]["growth"].items())]),
        ("issue 39's acceptance", ("goal", "value", "bound", "verdict"),
         [(v["name"], _value(v["value"]), v["goal"], verdict(v["passed"]))
          for v in found["verdicts"]]),
    ]  # fmt: skip
    for title, columns, rows in sections:
        table = Table(title=title)
        for column in columns:
            table.add_column(column, justify="left" if column in columns[:1] else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for failure in found["counts"]["failures"][:10]:
        console.print(f"failed #{failure['id']} at {failure['start_s']:.1f} s ({failure['target']}"
                      f", {failure['status']}, started={failure['started']}): "
                      f"{failure['why']}")  # fmt: skip


def plot(found: Mapping[str, Any], path: Path) -> None:
    figure, (top, bottom) = plots.pyplot().subplots(2, 1, figsize=(12, 7), sharex=True)
    for axes in (top, bottom):
        for event in found["faults"]:
            axes.axvspan(event["start_s"], max(event["end_s"], event["start_s"] + 0.5),
                         color=COLORS.get(event["kind"], "grey"), alpha=0.25)  # fmt: skip
    rows = found["rows"]
    for stream, marker in ((False, "."), (True, "+")):
        shown = [r for r in rows if r["ttft_s"] is not None and r["status"] == "ok"
                 and r["stream"] == stream]  # fmt: skip
        top.scatter([r["start_s"] for r in shown], [r["ttft_s"] for r in shown], s=8,
                    marker=marker, label="streamed" if stream else "whole")  # fmt: skip
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        height = max((r["ttft_s"] or 0.0 for r in rows), default=1.0) or 1.0
        top.scatter([r["start_s"] for r in failed], [height] * len(failed), color="red",
                    marker="x", label="failed")  # fmt: skip
    for kind, color in COLORS.items():
        top.plot([], [], color=color, alpha=0.4, linewidth=8, label=kind)
    top.set_ylabel("time to first token (s)")
    top.set_yscale("symlog", linthresh=0.1)
    top.legend(fontsize=7, ncol=3)
    names = sorted({s["name"] for s in found["memory"]["samples"]})
    for name in names:
        mine = [s for s in found["memory"]["samples"] if s["name"] == name]
        bottom.plot([s["t_s"] for s in mine], [s["rss_bytes"] / MIB for s in mine], label=name)
    bottom.set_ylabel("RSS (MiB)")
    bottom.set_xlabel("seconds into the run")
    bottom.legend(fontsize=7, ncol=4)
    top.set_title(command(found["settings"]))
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [(v["name"], _value(v["value"]), v["goal"], verdict(v["passed"]))
            for v in document["verdicts"]]  # fmt: skip
    rows += [(name, value, "", "") for name, value in _figures(document)]
    rows += [(f"TTFT {name} (n={n}), p50 / p99 s", f"{p50} / {p99}", "", "")
             for name, n, p50, p99 in _ttft_rows(document)]  # fmt: skip
    notes = tuple(f"- {kind} {target}: {start}–{end} s; kvtier's share before {before}, after "
                  f"{after}, back within 10 % after {back} s{'; ' + note if note else ''}"
                  for kind, target, start, end, before, after, back, note
                  in _fault_rows(document))  # fmt: skip
    growth = ", ".join(f"{k} {_value(v)}" for k, v in sorted(document["memory"]["growth"].items()))
    facts = (("memory growth after warm-up", growth or "not measured"),
             ("proxy restarted with --reuse-port", cell(document["reuse_port"])))  # fmt: skip
    return Summary("kvtier bench chaos", command(document["settings"]),
                   ("figure", "value", "goal", "verdict"), rows, facts,
                   ("Faults:", "", *notes) if notes else ())  # fmt: skip
