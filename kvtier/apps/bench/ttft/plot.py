"""``kvtier bench ttft``'s PNG: TTFT medians per length; the no-regret TTFT ratios against their
goals, with their spreads; the 0%-hit throughput ratio of every pair, its median and goal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.ttft.ratios import GOALS
from kvtier.apps.bench.ttft.report import LABELS, MEASURES

HIT_RATIOS = ("engine_hit_on_over_off", "kvtier_over_engine_hit")


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    figure, (ttft, ratios, throughput) = plots.pyplot().subplots(
        1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [3, 3, 2]}
    )
    ticks = (range(len(rows)), [_tick(row) for row in rows])
    _ttft(ttft, rows, ticks)
    _hit_ratios(ratios, rows, meta, ticks)
    _throughput(throughput, meta["throughput"])
    figure.suptitle(f"kvtier bench ttft: {meta['model']} ({meta['dtype']}), chunk "
                    f"{meta['chunk_tokens']} tokens, engine block {meta['engine_block_tokens']}; "
                    f"no regret: {'PASS' if meta['all_pass'] else 'FAIL'}")  # fmt: skip
    plots.save(figure, path)


def _ttft(axes: Any, rows: list[dict[str, Any]], ticks: tuple[range, list[str]]) -> None:
    width = 0.8 / len(MEASURES)
    for i, measure in enumerate(MEASURES):
        positions = [j + (i - (len(MEASURES) - 1) / 2) * width for j in range(len(rows))]
        values = [row.get(f"{measure}_s", 0.0) for row in rows]
        bars = axes.bar(positions, values, width, label=LABELS[measure])
        axes.bar_label(bars, [_seconds(v) if v else "" for v in values], fontsize=6, rotation=90)
    axes.set_yscale("log")
    axes.set_ylim(top=axes.get_ylim()[1] * 3)  # room for the labels and the legend
    axes.set_xticks(*ticks)
    axes.set_ylabel("time to first token (log scale)")
    axes.set_title("TTFT, median of fresh prompts (max_tokens=1)")
    axes.legend(loc="upper left", fontsize=7)


def _hit_ratios(
    axes: Any, rows: list[dict[str, Any]], meta: dict[str, Any], ticks: tuple[range, list[str]]
) -> None:
    verdicts = {(v["key"], v["prompt_tokens"]): v for v in meta["no_regret"]}
    top = 0.0
    for i, key in enumerate(HIT_RATIOS):
        found = [verdicts[key, row["prompt_tokens"]] for row in rows]
        positions = [j + (i - 0.5) * 0.38 for j in range(len(rows))]
        values = [v["ratio"] for v in found]
        errors = [v["ratio"] * v["spread"] for v in found]
        bars = axes.bar(positions, values, 0.38, yerr=errors, capsize=2, label=GOALS[key].label)
        axes.bar_label(bars, fmt="%.2f", fontsize=7, padding=3)
        colour = bars.patches[0].get_facecolor()
        axes.axhline(GOALS[key].bound, color=colour, linestyle="--", linewidth=1,
                     label=f"goal {GOALS[key].text}")  # fmt: skip
        top = max(top, *(v + e for v, e in zip(values, errors)), GOALS[key].bound)
    axes.axhline(1.0, color="black", linewidth=0.6)
    axes.set_ylim(0, top * 1.35)  # room for the legend above the bars
    axes.set_xticks(*ticks)
    axes.set_ylabel("TTFT ratio (median of pairs)")
    axes.set_title("no regret: hits")
    axes.legend(loc="upper left", fontsize=7, ncol=2)


def _throughput(axes: Any, t: dict[str, Any]) -> None:
    goal = GOALS["throughput_ratio"]
    pairs = range(1, len(t["ratios"]) + 1)
    axes.plot(pairs, t["ratios"], "o", markersize=4, label="pair")
    axes.axhline(t["ratio"], color="tab:blue", label=f"median {t['ratio']:.3f}")
    low, high = t["ratio"] * (1 - t["spread"]), t["ratio"] * (1 + t["spread"])
    axes.axhspan(low, high, color="tab:blue", alpha=0.15, label=f"95% CI ±{t['spread']:.1%}")
    axes.axhline(goal.bound, color="grey", linestyle="--", linewidth=1, label=f"goal {goal.text}")
    axes.set_xlabel("pair (A/B, B/A alternating)")
    axes.set_ylabel("tokens/s, kvtier / none")
    axes.set_title(f"no regret: 0%-hit throughput ({t['prompts']} x {t['prompt_tokens']} tokens)")
    axes.legend(loc="lower right", fontsize=7)


def _tick(row: dict[str, Any]) -> str:
    return f"{row['prompt_tokens']}" + ("" if row["aligned"] else "\nunaligned")


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.0f} ms"
