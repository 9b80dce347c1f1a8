"""``kvtier bench scheduler``'s table, plot and Markdown.

print_table(rows, meta, console), plot(rows, meta, path), summary(document) -> Summary
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary


def print_table(rows: list[dict[str, Any]], meta: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"kvtier scheduler half: ms per engine step, {meta['context']}-token contexts "
        f"decoding ({meta['steps']} steps); us/req = median / running; ratio = ms / bound (a "
        f"bare loop over the step's new block ids, us); goal <= {meta['goal_ms']} ms at "
        f"{meta['goal_running']} running"
    )
    columns = ("running", "mode", "blocks", "min", "median", "max", "us/req", "bound", "ratio")
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        ratio = row["ratio_to_bound"]
        table.add_row(
            str(row["running"]),
            row["mode"],
            f"{row['blocks_held']:,}",
            f"{row['ms_min']:.3f}",
            f"{row['ms_median']:.3f}",
            f"{row['ms_max']:.3f}",
            f"{row['ms_median'] * 1e3 / row['running']:.2f}",
            f"{row['bound_us_median']:.1f}",
            "-" if ratio is None else f"{ratio:.0f}",
        )
    console.print(table)
    goal = [r for r in rows if r["mode"] != "whole-table" and r["running"] == meta["goal_running"]]
    for row in goal:
        verdict = "meets" if row["ms_median"] <= meta["goal_ms"] else "misses"
        console.print(
            f"{row['mode']}: median {row['ms_median']:.3f} ms per step at {row['running']} "
            f"running requests: {verdict} the {meta['goal_ms']} ms goal"
        )


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    figure, (cost, ratio) = plots.pyplot().subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        picked = [r for r in rows if r["mode"] == mode]
        x = [r["running"] for r in picked]
        mid = [r["ms_median"] for r in picked]
        low = [m - r["ms_min"] for m, r in zip(mid, picked, strict=True)]
        high = [r["ms_max"] - m for m, r in zip(mid, picked, strict=True)]
        cost.errorbar(x, mid, yerr=[low, high], marker="o", capsize=4, label=mode)
        ratios = [(r["running"], r["ratio_to_bound"]) for r in picked if r["ratio_to_bound"]]
        ratio.plot([p[0] for p in ratios], [p[1] for p in ratios], marker="o", label=mode)
    cost.axhline(meta["goal_ms"], color="grey", linestyle="--", linewidth=1, label="goal")
    running = sorted({r["running"] for r in rows})
    for axes in (cost, ratio):
        axes.set_xscale("log", base=2)
        axes.set_xticks(running, [str(n) for n in running])
        axes.set_yscale("log")
        axes.set_xlabel("running requests")
        axes.legend(loc="upper left")
    cost.set_ylabel("ms per step (median; bars: min..max)")
    cost.set_title(f"scheduler half per step, {meta['context']}-token contexts")
    ratio.set_ylabel("cost / bare loop over new block ids")
    ratio.set_title("against the bound measured in the same step")
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [
        (str(row["running"]), row["mode"], f"{row['ms_min']:.3f}", f"{row['ms_median']:.3f}",
         f"{row['ms_max']:.3f}", f"{row['bound_us_median']:.1f}",
         "-" if row["ratio_to_bound"] is None else f"{row['ratio_to_bound']:.0f}")
        for row in document["rows"]
    ]  # fmt: skip
    running = list(dict.fromkeys(row["running"] for row in document["rows"]))
    modes = {row["mode"] for row in document["rows"]}
    command = (f"kvtier bench scheduler --running {' '.join(map(str, running))} --steps "
               f"{document['steps']} --warmup {document['warmup']} --context "
               f"{document['context']}")  # fmt: skip
    command += "" if "whole-table" in modes else " --no-compare"
    command += " --adapter" if "vllm-adapter" in modes else ""
    facts = (("goal", f"<= {document['goal_ms']} ms per step at {document['goal_running']} "
              "running requests"),)  # fmt: skip
    return Summary("kvtier bench scheduler", command,
                   ("running", "mode", "ms min", "ms median", "ms max", "bound µs",
                    "median / bound"), rows, facts)  # fmt: skip
