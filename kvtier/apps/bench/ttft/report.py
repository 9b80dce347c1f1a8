"""``kvtier bench ttft``'s report, from the result rows and the document's meta.

print_tables(rows, meta, console)   the TTFT medians, the no-regret ratios against their
                                    goals (PASS / FAIL), the other ratios, and warnings when
                                    other work disturbed the timings or a spread stayed
                                    above its goal
summary(document)  -> Summary       ``ttft-cpu.md``: the no-regret rows
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common.markdown import Summary, verdict
from kvtier.apps.bench.ttft.ratios import INFO

MEASURES = ("recompute", "engine_hit", "engine_hit_on", "kvtier_hit", "example_hit")
LABELS = dict(zip(MEASURES, (
    "recompute", "own hit, kvtier off", "own hit, kvtier on", "kvtier hit", "Example hit"
)))  # fmt: skip
UNALIGNED = "*"  # marks a length that is not a multiple of the chunk
OTHER_RATIOS = {**INFO, "kvtier_over_recompute": "kvtier hit / recompute",
                "example_over_engine_hit": "Example hit / own hit"}  # fmt: skip
OTHER_LOAD_WARNING = 0.1  # cores taken by other work during a phase


def print_tables(rows: list[dict[str, Any]], meta: dict[str, Any], console: Console) -> None:
    for table in (_ttft(rows, meta), _no_regret(meta), _others(rows), _throughput(meta)):
        console.print(table)
    console.print(f"{UNALIGNED} not a multiple of the chunk ({meta['chunk_tokens']} tokens)")
    verdicts = meta["no_regret"]
    failed = [v for v in verdicts if not v["pass"]]
    colour = "red" if failed else "green"
    console.print(f"[{colour}]no regret: {len(verdicts) - len(failed)} of {len(verdicts)} "
                  f"ratios within their goals[/{colour}]")  # fmt: skip
    for warning in _warnings(meta):
        console.print(f"[yellow]warning: {warning}[/yellow]")


def _ttft(rows: list[dict[str, Any]], meta: dict[str, Any]) -> Table:
    table = Table(title=f"TTFT, median seconds of {meta['repeats']} fresh prompts "
                  f"(max_tokens=1; chunk {meta['chunk_tokens']} tokens)")  # fmt: skip
    for column in ("tokens", *LABELS.values(), "kvtier chunks / full"):
        table.add_column(column, justify="right")
    for row in rows:
        cells = [f"{row[f'{m}_s']:.4f}" if f"{m}_s" in row else "-" for m in MEASURES]
        hits = f"{row['kvtier_hit_chunks']:.0f}/{row['full_chunks']}"
        table.add_row(_tokens(row), *cells, hits)
    return table


def _no_regret(meta: dict[str, Any]) -> Table:
    table = Table(title="No regret: ratios of paired measurements (median, 95% CI half-width)")
    for column in ("ratio", "tokens", "value", "spread", "pairs", "goal", ""):
        table.add_column(column, justify="left" if column == "ratio" else "right")
    for v in meta["no_regret"]:
        tokens = "-" if v["prompt_tokens"] is None else str(v["prompt_tokens"])
        verdict = "[green]PASS[/green]" if v["pass"] else "[red]FAIL[/red]"
        table.add_row(v["label"], tokens, f"{v['ratio']:.3f}", f"±{v['spread']:.1%}",
                      str(v["pairs"]), v["goal"], verdict)  # fmt: skip
    return table


def _others(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Other TTFT ratios (median of pairs)")
    for column in ("tokens", *OTHER_RATIOS.values()):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(_tokens(row), *(f"{row[k]:.3f}" if k in row else "-" for k in OTHER_RATIOS))
    return table


def _throughput(meta: dict[str, Any]) -> Table:
    t = meta["throughput"]
    title = (f"0%-hit throughput: {t['pairs']} pairs, each {t['prompts']} never-seen prompts of "
             f"{t['prompt_tokens']} tokens, {t['max_tokens']} out")  # fmt: skip
    table = Table(title=title)
    for column in ("none, tok/s", "kvtier, tok/s", "kvtier / none", "spread", "drain s"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{t['baseline_tokens_per_s']:.0f}", f"{t['kvtier_tokens_per_s']:.0f}",
        f"{t['ratio']:.3f}", f"±{t['spread']:.1%}", f"{t['kvtier_drain_s']:.4f}",
    )  # fmt: skip
    return table


def _warnings(meta: dict[str, Any]) -> list[str]:
    warnings = []
    disturbed = {k: v for k, v in meta["other_load_cores"].items() if (v or 0) > OTHER_LOAD_WARNING}
    if disturbed:
        phases = ", ".join(f"{phase} {cores:.2f}" for phase, cores in disturbed.items())
        warnings.append(f"other work on this machine took cores during: {phases}; "
                        "those timings are disturbed")  # fmt: skip
    t = meta["throughput"]
    if not t["precise"]:
        warnings.append(
            f"the throughput ratio's spread ±{t['spread']:.1%} is above its goal "
            f"±{t['spread_goal']:.0%} after {t['pairs']} pairs (--max-pairs)"
        )
    return warnings


def _tokens(row: dict[str, Any]) -> str:
    return str(row["prompt_tokens"]) + ("" if row["aligned"] else UNALIGNED)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [
        (v["label"], "-" if v["prompt_tokens"] is None else str(v["prompt_tokens"]),
         f"{v['ratio']:.3f}", f"±{v['spread']:.1%}", str(v["pairs"]), v["goal"],
         verdict(v["pass"]))
        for v in document["no_regret"]
    ]  # fmt: skip
    facts = (
        ("model", f"{document['model']} ({document['dtype']}), chunk {document['chunk_tokens']} "
                  f"tokens, {document['repeats']} fresh prompts per length"),
        ("other load (cores)", str(document.get("other_load_cores"))),
    )  # fmt: skip
    return Summary("kvtier bench ttft", _command(document),
                   ("ratio", "tokens", "value", "spread", "pairs", "goal", "result"), rows,
                   facts)  # fmt: skip


def _command(document: Mapping[str, Any]) -> str:
    """The ``kvtier bench ttft`` arguments the document was measured with."""
    rows, work = document["rows"], document["throughput"]
    lengths = [r["prompt_tokens"] for r in rows if "example_hit_s" in r]
    unaligned = [r["prompt_tokens"] for r in rows if "example_hit_s" not in r]
    parts = ["kvtier bench ttft", "--lengths", *map(str, lengths), "--unaligned",
             *map(str, unaligned)]  # fmt: skip
    parts += ["--repeats", str(document["repeats"]), "--pairs", str(work["min_pairs"]),
              "--max-pairs", str(work["max_pairs"]), "--chunk-tokens",
              str(document["chunk_tokens"]), "--model", str(document["model"]), "--dtype",
              str(document["dtype"])]  # fmt: skip
    defaults = {"prompts": 8, "prompt_tokens": 512, "max_tokens": 16}
    options = {"prompts": "--prompts", "prompt_tokens": "--prompt-tokens",
               "max_tokens": "--max-tokens"}  # fmt: skip
    for key, default in defaults.items():
        if work.get(key, default) != default:
            parts += [options[key], str(work[key])]
    return " ".join(parts)
