"""``kvtier bench concurrency``'s PNG and Markdown, from its verdict rows.

plot(rows, ratios_of, goals, path)   per part, each pair's ratio, their median, the goal
summary(document) -> Summary         ``concurrency.md``: each part's median (min–max)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary, verdict
from kvtier.apps.bench.common.ratios import Goal
from kvtier.apps.bench.common.timing import median


def plot(
    rows: list[dict[str, Any]],
    ratios_of: dict[str, list[float]],
    goals: Mapping[str, Goal],
    path: Path,
) -> None:
    figure, axes = plots.pyplot().subplots(1, max(1, len(rows)),
                                           figsize=(5 * max(1, len(rows)), 4),
                                           squeeze=False)  # fmt: skip
    for axis, row in zip(axes[0], rows, strict=False):
        ratios = ratios_of[row["key"]]
        pairs = range(1, len(ratios) + 1)
        axis.plot(pairs, ratios, "o", label="pairs")
        middle = median(ratios)  # unrounded: a share of 0.15 % is not the row's 0.002
        axis.axhline(middle, color="C0", linestyle="-", label=f"median {middle:.3g}")
        if row["goal"] is not None:
            axis.axhline(goals[row["key"]].bound, color="C3", linestyle="--",
                         label=f"goal {row['goal']}")  # fmt: skip
        share = row["key"].endswith("own_time")  # a share of the round, not a ratio
        if not share:
            axis.axhline(1.0, color="grey", linewidth=0.5)
        axis.set_xticks(list(pairs))
        axis.set_xlabel("pair")
        axis.set_ylabel("connector's time / the round" if share else "kvtier / without")
        judged = "" if row["pass"] is None else f": {'PASS' if row['pass'] else 'FAIL'}"
        axis.set_title(f"{row['label']}{judged}", fontsize=9)
        axis.legend(fontsize=8)
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [
        (row["label"], f"{row['ratio']:.3f}", f"{row['min']:.3f}", f"{row['max']:.3f}",
         f"±{row['spread']:.1%}", str(row["pairs"]), row["goal"] or "-", verdict(row["pass"]))
        for row in document["rows"]
    ]  # fmt: skip
    parts = ["kvtier bench concurrency"]
    rounds, served = document.get("rounds"), document.get("long_miss")
    if rounds is None:
        parts.append("--no-rounds")
    else:
        parts += ["--pairs", str(rounds["pairs"]), "--rounds", str(rounds["rounds"])]
    if served is None:
        parts.append("--no-served")
    else:
        parts += ["--served-pairs", str(served["pairs"])]
    if rounds is not None and rounds["prompts"] == 8 and rounds["filled_host"] is None:
        parts = ["kvtier bench concurrency --quick", *parts[1:]]
    models = ", ".join(f"{part}: {name} ({dtype})"
                       for part, (name, dtype) in document.get("models", {}).items())  # fmt: skip
    return Summary("kvtier bench concurrency", " ".join(parts),
                   ("ratio", "median", "min", "max", "spread", "pairs", "goal", "result"), rows,
                   (("models", models or "not recorded"),))  # fmt: skip
