"""``kvtier bench ttft``'s report: the terminal tables and the PNG, from the result rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

GOALS = {"kvtier_over_engine_hit": 1.1, "kvtier_over_example": 1.0, "throughput_ratio": 0.98}
MEASURES = ("recompute", "engine_hit", "kvtier_hit", "example_hit")
LABELS = dict(zip(MEASURES, ("recompute", "engine hit (floor)", "kvtier hit", "Example hit")))
OTHER_LOAD_WARNING = 0.1  # cores taken by other work during a phase
RATIOS = {
    "kvtier_over_engine_hit": "kvtier / engine hit",
    "example_over_engine_hit": "Example / engine hit",
    "kvtier_over_recompute": "kvtier / recompute",
    "kvtier_over_example": "kvtier / Example",
}


def print_tables(rows: list[dict[str, Any]], meta: dict[str, Any], console: Console) -> None:
    ttft = Table(title="TTFT, median seconds (max_tokens=1)")
    for column in ("tokens", *LABELS.values(), "kvtier chunks hit"):
        ttft.add_column(column, justify="right")
    for row in rows:
        hits = f"{row['kvtier_hit_chunks']:.0f}/{row['full_chunks']}"
        ttft.add_row(str(row["prompt_tokens"]), *(f"{row[f'{m}_s']:.3f}" for m in MEASURES), hits)
    ratios = Table(title="TTFT ratios (goals: kvtier / engine hit <= 1.1, kvtier / Example < 1)")
    for column in ("tokens", *RATIOS.values()):
        ratios.add_column(column, justify="right")
    for row in rows:
        ratios.add_row(str(row["prompt_tokens"]), *(f"{row[key]:.3f}" for key in RATIOS))
    t = meta["throughput"]
    throughput = Table(title=f"0%-hit throughput, {t['prompts']} unique prompts of "
                       f"{t['prompt_tokens']} tokens, {t['max_tokens']} tokens out")  # fmt: skip
    for column in ("none, tokens/s", "kvtier, tokens/s", "kvtier / none", "goal"):
        throughput.add_column(column, justify="right")
    throughput.add_row(f"{t['baseline_tokens_per_s']:.0f}", f"{t['kvtier_tokens_per_s']:.0f}",
                       f"{t['ratio']:.3f}", f">= {GOALS['throughput_ratio']}")  # fmt: skip
    for table in (ttft, ratios, throughput):
        console.print(table)
    disturbed = {k: v for k, v in meta["other_load_cores"].items() if (v or 0) > OTHER_LOAD_WARNING}
    if disturbed:
        phases = ", ".join(f"{phase} {cores:.2f}" for phase, cores in disturbed.items())
        console.print(f"[yellow]warning: other work on this machine took cores during: {phases}; "
                      "those timings are disturbed[/yellow]")  # fmt: skip


def plot(rows: list[dict[str, Any]], throughput: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (ttft, ratios) = plt.subplots(1, 2, figsize=(12, 4.5))
    ticks = (range(len(rows)), [f"{r['prompt_tokens']} tokens" for r in rows])
    for i, measure in enumerate(MEASURES):
        positions = [j + (i - 1.5) * 0.2 for j in range(len(rows))]
        values = [r[f"{measure}_s"] for r in rows]
        bars = ttft.bar(positions, values, 0.2, label=LABELS[measure])
        ttft.bar_label(bars, [_seconds(v) for v in values], fontsize=7)
    ttft.set_yscale("log")
    ttft.set_xticks(*ticks)
    ttft.set_ylabel("time to first token (log scale)")
    ttft.set_title("TTFT, median of fresh prompts (max_tokens=1)")
    ttft.legend(loc="upper left", fontsize=8)
    for i, (key, label) in enumerate(list(RATIOS.items())[:2]):
        positions = [j + (i - 0.5) * 0.38 for j in range(len(rows))]
        bars = ratios.bar(positions, [r[key] for r in rows], 0.38, label=label)
        ratios.bar_label(bars, fmt="%.2f", fontsize=8)
    goal = GOALS["kvtier_over_engine_hit"]
    ratios.axhline(goal, color="grey", linestyle="--", linewidth=1, label=f"goal {goal}")
    ratios.axhline(1.0, color="black", linewidth=0.8)
    top = max(max(r[key] for r in rows for key in list(RATIOS)[:2]), goal)
    ratios.set_ylim(0, top * 1.35)  # room for the legend above the bars
    ratios.set_xticks(*ticks)
    ratios.set_ylabel("TTFT / engine prefix-cache hit")
    ratios.set_title(f"hit TTFT over the floor; 0%-hit throughput kvtier / none "
                     f"{throughput['ratio']:.3f}")  # fmt: skip
    ratios.legend(loc="upper left", fontsize=8, ncol=3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.0f} ms"
