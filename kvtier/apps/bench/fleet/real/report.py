"""``kvtier bench fleet``'s real half: its table, its verdict, its plot and its Markdown.

report(results, goal)   each workload's figures per policy, kv-aware's ratios, the verdict
plot(results, path)
summary(document) -> Summary   ``fleet.md``: TTFT p50 and p90, requests/s, tokens computed
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary


def report(results: dict[str, Any], goal: float) -> None:
    """Each workload's figures per policy (medians over the repeats), then kv-aware's ratios
    against round-robin (min/median/max) and the TTFT goal's verdict."""
    console = Console()
    work = results["work"]
    for name, found in results["workloads"].items():
        table = Table(title=f"kvtier bench fleet, {name}: two engines ({work['model']}), "
                      f"medians of {work['repeats']} repeats")  # fmt: skip
        for column in ("policy", "TTFT p50 s", "TTFT p90 s", "req/s", "computed", "served"):
            table.add_column(column, justify="right")
        for policy, rows in found["policies"].items():
            table.add_row(
                policy,
                f"{_median(rows, 'ttft_p50_s'):.3f}",
                f"{_median(rows, 'ttft_p90_s'):.3f}",
                f"{_median(rows, 'requests_per_s'):.2f}",
                f"{_median(rows, 'computed'):,.0f}",
                " / ".join(str(n) for n in rows[-1]["served"]),
            )
        console.print(table)
        for key in ("ttft_p50_ratio", "computed_ratio"):
            values = found[key]
            console.print(f"{name}: kv-aware / round-robin, {key.removesuffix('_ratio')}: "
                          f"min {min(values):.3f}, median {statistics.median(values):.3f}, "
                          f"max {max(values):.3f}")  # fmt: skip
        if not found["outputs_equal"]:
            console.print(f"{name}: the policies' outputs differ (they must not)")
    ratios = results["workloads"]["chat"]["ttft_p50_ratio"]
    verdict = "PASS" if statistics.median(ratios) <= goal else "FAIL"
    console.print(f"chat TTFT p50, kv-aware / round-robin: median {statistics.median(ratios):.3f}"
                  f" (goal <= {goal}): {verdict}")  # fmt: skip


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(row[key] for row in rows))


def plot(results: dict[str, Any], path: Path) -> None:
    workloads = results["workloads"]
    figure, axes = plots.pyplot().subplots(
        1, 2 * len(workloads), figsize=(5 * len(workloads) * 2, 4)
    )
    for column, (name, found) in enumerate(workloads.items()):
        policies = list(found["policies"])
        ttft, computed = axes[2 * column], axes[2 * column + 1]
        for offset, key in ((-0.2, "ttft_p50_s"), (0.2, "ttft_p90_s")):
            values = [_median(found["policies"][p], key) for p in policies]
            ttft.bar([i + offset for i in range(len(policies))], values, width=0.4,
                     label=key.removeprefix("ttft_").removesuffix("_s"))  # fmt: skip
        ttft.set_xticks(range(len(policies)), policies)
        ttft.set_ylabel("TTFT (s)")
        ttft.set_title(f"{name}: time to first token")
        ttft.legend()
        values = [_median(found["policies"][p], "computed") for p in policies]
        computed.bar(range(len(policies)), values)
        computed.set_xticks(range(len(policies)), policies)
        computed.set_ylabel("prompt tokens computed")
        computed.set_title(f"{name}: computed by the fleet")
    figure.suptitle(f"kvtier bench fleet: two engines behind kvtier proxy "
                    f"({results['work']['model']}), medians of the repeats")  # fmt: skip
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = []
    for name, found in document["workloads"].items():
        for policy, runs in found["policies"].items():
            rows.append((name, policy, f"{_median(runs, 'ttft_p50_s'):.3f}",
                         f"{_median(runs, 'ttft_p90_s'):.3f}",
                         f"{_median(runs, 'requests_per_s'):.2f}",
                         f"{_median(runs, 'computed'):,.0f}"))  # fmt: skip
    facts = []
    for name, found in document["workloads"].items():
        for key in ("ttft_p50_ratio", "computed_ratio"):
            values = found[key]
            facts.append((f"{name}, kv-aware / round-robin, {key.removesuffix('_ratio')}",
                          f"{statistics.median(values):.3f} (min {min(values):.3f}, max "
                          f"{max(values):.3f})"))  # fmt: skip
    work = document["work"]
    command = (f"kvtier bench fleet --no-sim --repeats {work['repeats']} --model {work['model']} "
               f"--dtype {work['dtype']}")  # fmt: skip
    return Summary("kvtier bench fleet (real)", command,
                   ("workload", "policy", "TTFT p50 s", "TTFT p90 s", "requests/s",
                    "prompt tokens computed"), rows, tuple(facts))  # fmt: skip
