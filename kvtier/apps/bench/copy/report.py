"""``kvtier bench copy``'s report: the terminal table, the PNG and the Markdown.

print_table(rows, console, device)
plot(rows, path, device)
summary(document) -> Summary       ``copy-<device>.md``: each ratio, median (min-max)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary

if TYPE_CHECKING:
    import torch

CHUNK_TOKENS = (32, 64, 256)
GOAL = 0.8  # x a plain copy of the same bytes


def print_table(rows: list[dict[str, Any]], console: Console, device: torch.device) -> None:
    table = Table(title=f"kvtier host-tier copy / plain torch copy of the same bytes ({device})")
    for column in ("chunk tokens", "direction", "MiB per job", "ratio (median)", "min", "max"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["chunk_tokens"]),
            row["direction"],
            f"{row['bytes_per_job'] / 2**20:.0f}",
            f"{row['ratio_to_plain_copy']:.2f}",
            f"{row['ratio_min']:.2f}",
            f"{row['ratio_max']:.2f}",
        )
    console.print(table)


def plot(rows: list[dict[str, Any]], path: Path, device: torch.device) -> None:
    figure, axes = plots.pyplot().subplots(figsize=(6, 3.5))
    width = 0.38
    for i, direction in enumerate(("store", "load")):
        picked = [r for r in rows if r["direction"] == direction]
        positions = [j + (i - 0.5) * width for j in range(len(picked))]
        axes.bar(positions, [r["ratio_to_plain_copy"] for r in picked], width, label=direction)
    axes.axhline(GOAL, color="grey", linestyle="--", linewidth=1, label=f"goal {GOAL}")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(CHUNK_TOKENS)), [f"{t} tokens" for t in CHUNK_TOKENS])
    axes.set_ylabel("throughput / plain torch copy")
    axes.set_title(f"kvtier host tier, bench-model layout ({device.type})")
    axes.legend(loc="lower right")
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [
        (str(row["chunk_tokens"]), row["direction"], f"{row['bytes_per_job'] / 2**20:.0f}",
         f"{row['ratio_to_plain_copy']:.2f}", f"{row['ratio_min']:.2f}",
         f"{row['ratio_max']:.2f}", f">= {document.get('goal', GOAL)}")
        for row in document["rows"]
    ]  # fmt: skip
    command = (f"kvtier bench copy --tokens {document['tokens_per_job']} --rounds "
               f"{document['rounds']} --device {document['device']}")  # fmt: skip
    bound = "one plain torch copy of the same bytes"
    if "bound_threads" in document:
        bound += (f", {document['bound_threads']} threads, OMP_WAIT_POLICY "
                  f"{document['omp_wait_policy']}; kvtier on {document['cpu_copy_lanes']} copy "
                  "lanes")  # fmt: skip
    facts = (("bound", bound),)
    return Summary("kvtier bench copy", command,
                   ("chunk tokens", "direction", "MiB per job", "ratio / plain copy", "min",
                    "max", "goal"), rows, facts)  # fmt: skip
