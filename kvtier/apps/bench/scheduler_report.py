"""``kvtier bench scheduler``'s table and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (cost, ratio) = plt.subplots(1, 2, figsize=(10, 4))
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
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
