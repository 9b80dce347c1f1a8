"""``kvtier bench redis``'s report: the ratio rows, the terminal table and the PNG.

Every figure is a throughput ratio, kvtier's over a baseline's on the same bytes in the same round
(= the baseline's seconds / kvtier's seconds; above 1.0: kvtier is faster). Per chunk size:

    load_over_get    kvtier load into engine blocks / redis-py pipelined GET   goal >= 2.0
    load_over_raw    kvtier load into engine blocks / raw loopback TCP stream  goal >= 0.5
    store_over_set   kvtier store (write_many) / redis-py pipelined SET        no goal
    store_over_raw   kvtier store (write_many) / raw loopback TCP stream       no goal

    ratio_rows(sizes) -> rows, print_table(rows, meta, console), plot(rows, meta, path),
    print_ttft(ttft, console), summary(document) -> Summary (``redis.md``)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary, verdict
from kvtier.apps.bench.common.timing import median

# row key -> (label, kvtier's side, the baseline's side)
RATIOS: dict[str, tuple[str, str, str]] = {
    "load_over_get": ("load / redis-py GET", "kvtier_load", "redispy_get"),
    "load_over_raw": ("load / raw stream", "kvtier_load", "raw_load"),
    "store_over_set": ("store / redis-py SET", "kvtier_store", "redispy_set"),
    "store_over_raw": ("store / raw stream", "kvtier_store", "raw_store"),
}
GOALS: dict[str, float] = {"load_over_get": 2.0, "load_over_raw": 0.5}  # at least, every size
COLUMNS = ("chunk", "ratio", "median", "min", "max", "kvtier", "baseline", "goal", "")
OTHER_LOAD_WARNING = 0.1  # cores taken by other work during the run


def ratio_rows(sizes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per chunk size and ratio; ``pass`` is None where the issue sets no goal."""
    rows = []
    for size in sizes:
        seconds, nbytes = size["seconds"], size["payload_bytes"]
        for key, (label, mine, bound) in RATIOS.items():
            ratios = [b / k for b, k in zip(seconds[bound], seconds[mine], strict=True)]
            ratio = round(median(ratios), 3)
            goal = GOALS.get(key)
            rows.append({
                "chunk_tokens": size["chunk_tokens"], "chunk_bytes": size["chunk_bytes"],
                "key": key, "label": label, "ratio": ratio,
                "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
                "ratios": [round(r, 3) for r in ratios],
                "kvtier_mib_s": round(nbytes / median(seconds[mine]) / 2**20, 1),
                "bound_mib_s": round(nbytes / median(seconds[bound]) / 2**20, 1),
                "goal": f">= {goal}" if goal is not None else None,
                "pass": ratio >= goal if goal is not None else None,
            })  # fmt: skip
    return rows


def print_table(rows: list[dict[str, Any]], meta: dict[str, Any], console: Console) -> None:
    title = (
        f"kvtier Redis tier / a baseline, same run: {meta['server']} on "
        f"loopback, redis-py {meta['redis_py']} ({meta['parser']}), {meta['payload_mib']} MiB "
        f"a round, {meta['rounds']} rounds after a warm-up; throughput in MiB/s"
    )
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "ratio" else "right")
    for row in rows:
        result = {True: "[green]PASS[/green]", False: "[red]FAIL[/red]", None: ""}[row["pass"]]
        table.add_row(
            f"{row['chunk_tokens']} tok", row["label"], f"{row['ratio']:.3f}",
            f"{row['ratio_min']:.2f}", f"{row['ratio_max']:.2f}", f"{row['kvtier_mib_s']:.0f}",
            f"{row['bound_mib_s']:.0f}", row["goal"] or "", result,
        )  # fmt: skip
    console.print(table)
    for size in meta["sizes"]:
        phases = ", ".join(f"{name} {ms:.1f}" for name, ms in size["load_phases_ms"].items())
        load = median(size["seconds"]["kvtier_load"]) * 1e3
        console.print(f"{size['chunk_tokens']} tokens: kvtier load {load:.1f} ms; its parts alone "
                      f"(ms): {phases}")  # fmt: skip
    verdicts = [f"{key} {'met' if met else 'NOT met'}" for key, met in goal_verdicts(rows).items()]
    console.print("goals (every chunk size): " + ", ".join(verdicts))
    if (meta.get("other_load_cores") or 0) > OTHER_LOAD_WARNING:
        console.print(f"[yellow]warning: other work on this machine took "
                      f"{meta['other_load_cores']:.2f} cores during the run; those timings are "
                      "disturbed[/yellow]")  # fmt: skip


def goal_verdicts(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """Per goal, whether every chunk size met it."""
    return {key: all(r["pass"] for r in rows if r["key"] == key) for key in GOALS}


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Two panels, load and store: per chunk size, each ratio's median bar, its rounds as dots."""
    sizes = sorted({r["chunk_tokens"] for r in rows})
    figure, panels = plots.pyplot().subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for axes, side in zip(panels, ("load", "store"), strict=True):
        keys = [k for k in RATIOS if k.startswith(side)]
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            picked = sorted((r for r in rows if r["key"] == key), key=lambda r: r["chunk_tokens"])
            x = [sizes.index(r["chunk_tokens"]) + (i - (len(keys) - 1) / 2) * width for r in picked]
            bars = axes.bar(x, [r["ratio"] for r in picked], width, label=RATIOS[key][0])
            axes.bar_label(bars, fmt="%.2f", fontsize=8, label_type="center", color="white")
            for position, row in zip(x, picked, strict=True):
                axes.plot([position] * len(row["ratios"]), row["ratios"], "k.", alpha=0.5)
            if key in GOALS:
                axes.axhline(GOALS[key], color=bars.patches[0].get_facecolor(), linestyle="--",
                             linewidth=1, label=f"goal {GOALS[key]}")  # fmt: skip
        axes.axhline(1.0, color="black", linewidth=0.8)
        axes.set_xticks(range(len(sizes)), [_tick(size) for size in meta["sizes"]], fontsize=8)
        axes.set_title(f"{side}: kvtier throughput / baseline, {meta['payload_mib']} MiB a round",
                       fontsize=9)  # fmt: skip
        axes.legend(loc="upper left", fontsize=8)
    panels[0].set_ylabel("throughput ratio (dots: each round)")
    figure.suptitle(
        f"kvtier Redis tier vs redis-py (parser {meta['parser']}) and a raw loopback TCP stream",
        fontsize=10,
    )
    plots.save(figure, path)


def _tick(size: dict[str, Any]) -> str:
    return (f"{size['chunk_tokens']} tokens, {size['chunk_bytes'] >> 10} KiB\n"
            f"({size['engine_block_tokens']}-token engine blocks)")  # fmt: skip


def print_ttft(ttft: dict[str, Any], console: Console) -> None:
    """The TTFT section's ratios and verdict."""
    verdict = "[green]met[/]" if ttft["goal_met"] else "[red]not met[/]"
    console.print(
        f"TTFT of a {ttft['prompt_tokens']}-token prompt ({ttft['model']}, median of "
        f"{ttft['repeats']}): from Redis {ttft['kvtier_redis_s'] * 1e3:.1f} ms, host tier "
        f"{ttft['kvtier_host_s'] * 1e3:.1f} ms, recompute {ttft['recompute_s'] * 1e3:.1f} ms; "
        f"Redis / recompute {ttft['kvtier_redis_over_recompute']:.3f} (goal <= "
        f"{ttft['goal_redis_over_recompute']}: {verdict}), Redis / host "
        f"{ttft['kvtier_redis_over_host']:.3f}"
    )


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [
        (f"{row['chunk_tokens']} tokens", row["label"], f"{row['ratio']:.3f}",
         f"{row['ratio_min']:.2f}", f"{row['ratio_max']:.2f}", f"{row['kvtier_mib_s']:.0f}",
         f"{row['bound_mib_s']:.0f}", row["goal"] or "-", verdict(row["pass"]))
        for row in document["rows"]
    ]  # fmt: skip
    ttft = document.get("ttft")
    command = "kvtier bench redis" + (" --quick" if document["payload_mib"] == 16 else "")
    command += f" --rounds {document['rounds']} --server {document['server'].split()[0]}"
    facts = [("server", f"{document['server']}, redis-py {document['redis_py']} "
                        f"({document['parser']}), {document['payload_mib']} MiB a round"),
             ("other load (cores)", str(document.get("other_load_cores")))]  # fmt: skip
    if ttft is not None:
        command += (f" --ttft --ttft-tokens {ttft['prompt_tokens']} --ttft-repeats "
                    f"{ttft['repeats']} --model {ttft['model']} "
                    f"--dtype {ttft['dtype']}")  # fmt: skip
        facts.append(("TTFT from Redis", f"{ttft['kvtier_redis_over_recompute']:.3f} x "
                      f"recompute (goal <= {ttft['goal_redis_over_recompute']}: "
                      f"{'met' if ttft['goal_met'] else 'not met'}), "
                      f"{ttft['kvtier_redis_over_host']:.3f} x the host tier's hit"))  # fmt: skip
    return Summary("kvtier bench redis", command,
                   ("chunk", "ratio", "median", "min", "max", "kvtier MiB/s", "bound MiB/s",
                    "goal", "result"), rows, tuple(facts))  # fmt: skip
