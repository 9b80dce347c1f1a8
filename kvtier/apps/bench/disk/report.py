"""``kvtier bench disk``'s report: the ratio rows, the terminal table, the PNG, the Markdown.

ratio_rows(throughput, ttft) -> rows   one row per ratio, against its goal where it has one
print_table(rows, meta, console)
plot(rows, meta, path)
summary(document) -> Summary           ``disk-<device>.md``: the ratio rows
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary, verdict

# row key -> (comparison, goal): throughput ratios are at least, TTFT ratios below
GOALS: dict[str, tuple[str, float]] = {
    "cold_load": (">=", 0.7),
    "kvtier_disk_over_example": ("<", 1.0),
}
OTHER_LOAD_WARNING = 0.1  # cores taken by other work during a phase
THROUGHPUT = {
    "store": "store / raw write",
    "cold_load": "cold load / raw read",
    "warm_load": "warm load / raw read",
}
TTFT = {
    "kvtier_disk_over_recompute": ("TTFT disk / recompute", "kvtier_disk", "recompute"),
    "example_over_recompute": ("TTFT Example / recompute", "example", "recompute"),
    "kvtier_disk_over_example": ("TTFT disk / Example", "kvtier_disk", "example"),
}


def ratio_rows(throughput: dict[str, Any], ttft: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per ratio; ``pass`` is None where the issue sets no goal."""
    rows = []
    for key, label in THROUGHPUT.items():
        m = throughput["measures"][key]
        spread = {"ratio_min": m["ratio_min"], "ratio_max": m["ratio_max"]}
        sides = {"kvtier": m["kvtier_mib_s"], "bound": m["raw_mib_s"], "unit": "MiB/s"}
        rows.append(
            {"key": key, "label": label, "kind": "throughput", "ratio": m["ratio"]} | spread | sides
        )
    for key, (label, mine, bound) in TTFT.items():
        sides = {"kvtier": ttft[f"{mine}_s"], "bound": ttft[f"{bound}_s"], "unit": "s"}
        rows.append({"key": key, "label": label, "kind": "ttft", "ratio": ttft[key]} | sides)
    for row in rows:
        comparison, goal = GOALS.get(row["key"], ("", 0.0))
        row["goal"] = f"{comparison} {goal}" if comparison else None
        row["pass"] = _meets(row["ratio"], comparison, goal) if comparison else None
    return rows


def _meets(ratio: float, comparison: str, goal: float) -> bool:
    return ratio >= goal if comparison == ">=" else ratio < goal


def print_table(rows: list[dict[str, Any]], meta: dict[str, Any], console: Console) -> None:
    t, f = meta["throughput"], meta["ttft"]
    chunk_mib = t["chunk_file_bytes"] / 2**20
    title = (
        f"kvtier disk tier / a bound measured in the same run ({meta['device']}, "
        f"{meta['file_system']}): {t['chunks']} chunks of {chunk_mib:.1f} MiB, {t['rounds']} "
        f"rounds; TTFT of {f['prompt_tokens']}-token prompts, {f['model']} model, {f['repeats']} "
        "prompts"
    )
    table = Table(title=title)
    for column in ("ratio", "median", "min", "max", "kvtier", "bound", "goal", "result"):
        table.add_column(column, justify="left" if column == "ratio" else "right")
    for row in rows:
        spread = (
            [f"{row[k]:.2f}" for k in ("ratio_min", "ratio_max")]
            if "ratio_min" in row
            else ["", ""]
        )
        result = {True: "[green]PASS[/green]", False: "[red]FAIL[/red]", None: ""}[row["pass"]]
        table.add_row(row["label"], f"{row['ratio']:.3f}", *spread, _value(row, "kvtier"),
                      _value(row, "bound"), row["goal"] or "", result)  # fmt: skip
    console.print(table)
    console.print(f"TTFT from disk: kvtier's disk loads took {f['kvtier_disk_load_s']:.3f} s of "
                  f"{f['kvtier_disk_s']:.3f} s; the engine stepped {f['kvtier_disk_steps']:.0f} "
                  "times meanwhile (median)")  # fmt: skip
    loads = {"throughput": t["other_load_cores"], **f["other_load_cores"]}
    disturbed = {k: v for k, v in loads.items() if (v or 0) > OTHER_LOAD_WARNING}
    if disturbed:
        phases = ", ".join(f"{phase} {cores:.2f}" for phase, cores in disturbed.items())
        console.print(f"[yellow]warning: other work on this machine took cores during: {phases}; "
                      "those timings are disturbed[/yellow]")  # fmt: skip


def _value(row: dict[str, Any], side: str) -> str:
    value = row[side]
    return f"{value:.0f} MiB/s" if row["unit"] == "MiB/s" else f"{value:.3f} s"


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    plt = plots.pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    figure, (speed, ttft) = plt.subplots(1, 2, figsize=(12, 4.5))
    picked = [r for r in rows if r["kind"] == "throughput"]
    bars = speed.bar(range(len(picked)), [r["ratio"] for r in picked], 0.6, label="median")
    speed.bar_label(bars, fmt="%.2f", fontsize=9, label_type="center", color="white")
    rounds = [meta["throughput"]["measures"][r["key"]]["ratios"] for r in picked]
    top = 1.6  # ratios above it (a write that found the disk idle) are drawn at the top
    for x, ratios in enumerate(rounds):
        speed.plot([x] * len(ratios), [min(r, top) for r in ratios], "k.", alpha=0.5,
                   label="each round" if x == 0 else None)  # fmt: skip
    goal = GOALS["cold_load"][1]
    speed.axhline(goal, color="grey", linestyle="--", linewidth=1, label=f"goal (cold load) {goal}")
    speed.axhline(1.0, color="black", linewidth=0.8)
    speed.set_ylim(0, top * 1.05)
    speed.set_xticks(range(len(picked)), [THROUGHPUT[r["key"]] for r in picked], fontsize=8)
    speed.set_ylabel("kvtier throughput / raw sequential I/O")
    t = meta["throughput"]
    speed.set_title(f"disk tier vs dd-like I/O, {t['chunks']} chunk files, {meta['file_system']}",
                    fontsize=9)  # fmt: skip
    speed.legend(loc="upper right", fontsize=8)
    f = meta["ttft"]
    labels = {"recompute": "recompute", "kvtier_disk": "kvtier from disk", "example": "Example"}
    values = [f[f"{m}_s"] for m in labels]
    bars = ttft.bar(range(len(labels)), values, 0.6, color=["grey", "tab:blue", "tab:orange"])
    ttft.bar_label(
        bars, [f"{v:.2f} s" if v >= 1 else f"{v * 1e3:.0f} ms" for v in values], fontsize=8
    )
    ttft.set_yscale("log")
    ttft.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ttft.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g} s"))
    ttft.yaxis.set_minor_formatter(NullFormatter())
    ttft.set_xticks(range(len(labels)), list(labels.values()))
    ttft.set_ylabel("time to first token (log scale)")
    ttft.set_title(
        f"TTFT, {f['prompt_tokens']} tokens, restarted engine, page cache dropped; "
        f"kvtier / Example {f['kvtier_disk_over_example']:.2f}",
        fontsize=9,
    )
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    t, f = document["throughput"], document["ttft"]
    rows = [
        (row["label"], f"{row['ratio']:.3f}",
         f"{row['ratio_min']:.2f}" if "ratio_min" in row else "-",
         f"{row['ratio_max']:.2f}" if "ratio_max" in row else "-",
         _value(row, "kvtier"), _value(row, "bound"), row["goal"] or "-", verdict(row["pass"]))
        for row in document["rows"]
    ]  # fmt: skip
    command = (f"kvtier bench disk --chunks {t['chunks']} --layers {t['layers']} --rounds "
               f"{t['rounds']} --tokens {f['prompt_tokens']} --repeats {f['repeats']} --model "
               f"{f['model']} --dtype {f['dtype']} --device {document['device']}")  # fmt: skip
    facts = (("file system", str(document["file_system"])),
             ("chunks", f"{t['chunks']} of {t['chunk_file_bytes'] / 2**20:.1f} MiB"))  # fmt: skip
    return Summary("kvtier bench disk", command,
                   ("ratio", "median", "min", "max", "kvtier", "bound", "goal", "result"), rows,
                   facts)  # fmt: skip
