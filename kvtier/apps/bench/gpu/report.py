"""What ``kvtier bench gpu`` shows: the table against the goals, and the PNG.

print_table(document, console)   every figure's median, min and max against its goal
plot(document, path) -> str | None   the PNG (None), or why there is none (matplotlib
                                 absent: the GPU machine may lack it)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.gpu.advice import advise
from kvtier.apps.bench.gpu.figures import FIGURES, rows


def cell(value: float | None) -> str:
    return "null" if value is None else f"{value:.3g}"


def verdict(met: bool | None) -> str:
    return {True: "yes", False: "NO", None: "-"}[met]


def print_table(document: Mapping[str, Any], console: Console) -> None:
    table = Table(title=f"kvtier bench gpu: {document.get('device')} ({document.get('date')})")
    for column in ("shape", "figure", "mechanism", "median", "min", "max", "goal", "met"):
        table.add_column(column, justify="left" if column in ("shape", "figure") else "right")
    for row in rows(document):
        goal = "-" if row["goal"] is None else f"{row['how']} {row['goal']}"
        table.add_row(row["shape"], row["figure"], row["mechanism"], cell(row["median"]),
                      cell(row["min"]), cell(row["max"]), goal, verdict(row["met"]))  # fmt: skip
    console.print(table)
    for row in rows(document):
        if row["median"] is None:
            console.print(f"{row['shape']} {row['figure']}: null: {row['why']}")
    for name in ("pinning_rate_bytes_s", "pinning_engine_held_s"):
        value = document.get(name)
        why = document.get("why_null", {}).get(name, "")
        console.print(f"{name}: {value if value is not None else 'null: ' + why}")
    advice = advise(document)
    if advice is not None:
        console.print(f"advised for this GPU: KVTIER_GPU_COPY={advice.value}")
        for side, choice in zip(("store", "load"), advice, strict=True):
            console.print(f"  {side}s by {choice.mechanism.value}: {choice.why}")
    for error in document.get("errors", []):
        console.print(f"[red]{error['shape']} {error['measure']}: {error['error']}[/red]")


def plot(document: Mapping[str, Any], path: Path) -> str | None:
    try:
        plt = plots.pyplot()
    except ImportError as error:
        return f"no PNG: matplotlib does not import ({error})"
    table = rows(document)
    figure, axes = plt.subplots(3, 3, figsize=(13, 9))
    for ax, name in zip(axes.ravel(), FIGURES, strict=True):
        picked = [r for r in table if r["figure"] == name and r["median"] is not None]
        labels = [r["shape"] + (f"\n{r['mechanism']}" if r["mechanism"] else "") for r in picked]
        medians = [r["median"] for r in picked]
        below = [r["median"] - r["min"] for r in picked]
        above = [r["max"] - r["median"] for r in picked]
        positions = range(len(picked))
        colors = ["tab:green" if r["met"] else "tab:red" if r["met"] is False else "tab:grey"
                  for r in picked]  # fmt: skip
        ax.bar(positions, medians, yerr=[below, above], color=colors, capsize=3)
        for x, r in zip(positions, picked, strict=True):
            if r["goal"] is not None:
                ax.hlines(r["goal"], x - 0.45, x + 0.45, colors="black", linestyles="--")
        ax.set_xticks(list(positions), labels, fontsize=7)
        ax.set_title(name, fontsize=9)
    figure.suptitle(f"kvtier bench gpu: {document.get('device')}, {document.get('date')} "
                    "(bars: median, min-max; dashes: goal)", fontsize=10)  # fmt: skip
    plots.save(figure, path, dpi=110)
    return None
