"""``kvtier bench transfer``'s table, figure and Markdown: each method's throughput over one raw
stream.

    print_table(rows, console), plot(rows, path, methods), summary(document) -> Summary
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary

BLOCK_TOKENS = 16  # the bench engines' blocks (``peer.BenchEngine``)
BLOCKS_PER_MIB = 4  # the bench model's blocks are 256 KiB
METHODS = ("kvtier-1", "kvtier-2", "raw-1", "raw-2", "mooncake")
CHUNK_TOKENS = (16, 64, 256)
GOALS = {"kvtier-1": 1.0, "kvtier-2": 1.5}  # x raw-1, at messages of 1 MiB or more


def print_table(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="kvtier prefill->decode pulls / one raw TCP stream of the same bytes")
    for column in ("chunk", "message", "method", "GB/s (median)", "ratio (median)", "min", "max"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            f"{row['chunk_tokens']} tokens",
            f"{row['message_bytes'] / 2**20:.2f} MiB",
            row["method"],
            f"{row['gbps_median']:.2f}",
            f"{row['ratio_to_raw_stream']:.2f}",
            f"{row['ratio_min']:.2f}",
            f"{row['ratio_max']:.2f}",
        )
    console.print(table)
    console.print(
        "goals at >= 1 MiB per message: " + ", ".join(f"{m} >= {g}" for m, g in GOALS.items())
    )


def plot(rows: list[dict[str, Any]], path: Path, methods: list[str]) -> None:
    figure, axes = plots.pyplot().subplots(figsize=(7, 3.8))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        picked = [r for r in rows if r["method"] == method]
        positions = [CHUNK_TOKENS.index(r["chunk_tokens"]) + (i - (len(methods) - 1) / 2) * width
                     for r in picked]  # fmt: skip
        medians = [r["ratio_to_raw_stream"] for r in picked]
        errors = [[m - r["ratio_min"] for m, r in zip(medians, picked)],
                  [r["ratio_max"] - m for m, r in zip(medians, picked)]]  # fmt: skip
        axes.bar(positions, medians, width, yerr=errors, capsize=2, label=method)
    for method, goal in GOALS.items():
        axes.axhline(goal, color="grey", linestyle="--", linewidth=1)
        axes.annotate(f"goal {method}", (len(CHUNK_TOKENS) - 0.5, goal), fontsize=7,
                      ha="right", va="bottom", color="grey")  # fmt: skip
    labels = [f"{t} tokens\n{t // BLOCK_TOKENS / BLOCKS_PER_MIB:g} MiB" for t in CHUNK_TOKENS]
    axes.set_xticks(range(len(CHUNK_TOKENS)), labels)
    axes.set_ylabel("throughput / one raw TCP stream")
    axes.set_title("prefill->decode over loopback TCP, bench-model layout")
    axes.legend(loc="upper left", fontsize=8)
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [
        (f"{row['chunk_tokens']} tokens", f"{row['message_bytes'] / 2**20:.2f} MiB",
         row["method"], f"{row['gbps_median']:.2f}", f"{row['ratio_to_raw_stream']:.2f}",
         f"{row['ratio_min']:.2f}", f"{row['ratio_max']:.2f}")
        for row in document["rows"]
    ]  # fmt: skip
    quick = document["bytes_per_trial"] == 16 << 20
    goals = ", ".join(f"{m} >= {g}" for m, g in GOALS.items())
    facts = (("trials", f"{document['bytes_per_trial'] >> 20} MiB each, "
              f"{document['repetitions']} repetitions"),
             ("goals at >= 1 MiB per message", goals),
             ("mooncake", str(document["mooncake"].get("package") or "not installed")))  # fmt: skip
    return Summary("kvtier bench transfer",
                   "kvtier bench transfer" + (" --quick" if quick else ""),
                   ("chunk", "message", "method", "GB/s", "ratio / raw-1", "min", "max"), rows,
                   facts)  # fmt: skip
