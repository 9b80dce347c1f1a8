"""``kvtier bench fleet``'s simulated half: its goals, its table and its plot.

goals(rows, engines)          -> [Goal]   kv-aware's goals, judged at ``engines``
ceiling(rows, engines)        -> float    the most any router reaches / round-robin's hit rate
print_table(rows, goals, console)
plot(rows, path)                          hit rate, imbalance, decision p99 per fleet size
summary(document)             -> Summary  ``fleet-sim.md``: each size and policy, the goals
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary

ORACLE_RATIO = 0.9  # kv-aware's hit rate, at least this times the oracle's
ROUND_ROBIN_RATIO = 2.0  # and this times round-robin's
IMBALANCE = 1.25  # kv-aware's max / mean in flight, at most
DECISION_US = 100.0  # kv-aware's decision p99 (wall clock), at most


class Goal(NamedTuple):
    name: str
    value: float
    limit: float
    passed: bool


def goals(rows: list[dict[str, Any]], engines: int) -> list[Goal]:
    by = {row["policy"]: row for row in rows if row["engines"] == engines}
    kv = by["kv-aware"]
    oracle = kv["hit_rate"] / max(by["oracle"]["hit_rate"], 1e-9)
    round_robin = kv["hit_rate"] / max(by["round-robin"]["hit_rate"], 1e-9)
    return [
        Goal("hit rate / oracle's", oracle, ORACLE_RATIO, oracle >= ORACLE_RATIO),
        Goal("hit rate / round-robin's", round_robin, ROUND_ROBIN_RATIO,
             round_robin >= ROUND_ROBIN_RATIO),
        Goal("load imbalance", kv["imbalance"], IMBALANCE, kv["imbalance"] <= IMBALANCE),
        Goal("decision p99 (us)", kv["decision_us_p99"], DECISION_US,
             kv["decision_us_p99"] <= DECISION_US),
    ]  # fmt: skip


def ceiling(rows: list[dict[str, Any]], engines: int) -> float | None:
    """The ceiling's hit rate (every engine holding every block computed so far, caches without
    limit: no router does better) over round-robin's, at ``engines`` (None: not measured). Below
    ``ROUND_ROBIN_RATIO`` the trace itself rules that goal out: round-robin already holds the
    shared system prompts, and the rest of a prompt is new to any cache."""
    for row in rows:
        if row["engines"] == engines and row.get("ceiling_hit_rate") is not None:
            return float(row["ceiling_hit_rate"]) / max(float(row["hit_rate"]), 1e-9)
    return None


def print_table(
    rows: list[dict[str, Any]], judged: list[Goal], engines: int, console: Console
) -> None:
    table = Table(
        title="kvtier proxy, simulated: hit rate = prompt tokens the chosen engine held (GPU or "
        "host) / prompt tokens; imbalance = max / mean in flight, averaged over dispatches; "
        "TTFT in simulated ms; decision = the prompt's stretches (its digests, looked up) + "
        "choose (wall us; cpu: the thread's CPU time; digests p99: the prompt's digests alone, "
        "every block, as a list of ints, timed apart from the decision; hash p99: the prompt's "
        "tokens hashed once, as one tuple: each token of the Python list read once, the floor "
        "of any router keyed by tokens that is handed them as a list)"
    )
    columns = ("engines", "policy", "hit rate", "of GPU", "imbalance", "in flight", "TTFT p50",
               "TTFT p90", "decision p50", "p99", "cpu p99", "digests p99", "hash p99",
               "index blocks", "B/block")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["engines"]),
            row["policy"],
            f"{row['hit_rate']:.3f}",
            f"{row['gpu_share']:.2f}",
            f"{row['imbalance']:.2f}",
            f"{row['in_flight_mean']:.1f}",
            f"{row['ttft_p50_ms']:.1f}",
            f"{row['ttft_p90_ms']:.1f}",
            _maybe(row["decision_us_p50"]),
            _maybe(row["decision_us_p99"]),
            _maybe(row["decision_cpu_us_p99"]),
            _maybe(row.get("digest_us_p99")),
            _maybe(row.get("hash_us_p99")),
            _maybe(row["index_blocks"], "{:,}"),
            _maybe(row["index_bytes_per_block"], "{:,}"),
        )
    console.print(table)
    for goal in judged:
        verdict = "PASS" if goal.passed else "FAIL"
        sign = "<=" if goal.name in ("load imbalance", "decision p99 (us)") else ">="
        console.print(
            f"{verdict}  kv-aware at {engines} engines: {goal.name} {goal.value:.2f} "
            f"(goal {sign} {goal.limit:g})"
        )
    timed = [row for row in rows if row["engines"] == engines and row.get("hash_us_p99")]
    for row in timed:
        console.print(
            f"      the floor at {engines} engines, p99: the prompt's tokens hashed once "
            f"{row['hash_us_p99']:.1f} us (each token read once: any router keyed by tokens "
            f"does more); the decision {row['decision_us_p99'] / row['hash_us_p99']:.2f} x it; "
            f"this index's digests alone, as ints, {row['digest_us_p99']:.1f} us"
        )
    bound = ceiling(rows, engines)
    if bound is not None:
        console.print(
            f"      the ceiling at {engines} engines (every block computed so far in every "
            f"engine): {bound:.2f} x round-robin's hit rate, the most any router reaches"
        )


def _maybe(value: float | None, form: str = "{:.1f}") -> str:
    return "-" if value is None else form.format(value)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    figure, (hits, balance, decision) = plots.pyplot().subplots(1, 3, figsize=(14, 4))
    engines = sorted({row["engines"] for row in rows})
    for policy in dict.fromkeys(row["policy"] for row in rows):
        picked = [row for row in rows if row["policy"] == policy]
        x = [row["engines"] for row in picked]
        hits.plot(x, [row["hit_rate"] for row in picked], marker="o", label=policy)
        balance.plot(x, [row["imbalance"] for row in picked], marker="o", label=policy)
    kv = [row for row in rows if row["decision_us_p99"] is not None]
    x = [row["engines"] for row in kv]
    decision.plot(x, [row["decision_us_p99"] for row in kv], marker="o", label="p99 wall")
    decision.plot(x, [row["decision_cpu_us_p99"] for row in kv], marker="o", label="p99 cpu")
    decision.plot(x, [row["decision_us_p50"] for row in kv], marker="o", label="p50 wall")
    balance.axhline(IMBALANCE, color="grey", linestyle="--", linewidth=1, label="goal")
    decision.axhline(DECISION_US, color="grey", linestyle="--", linewidth=1, label="goal")
    for axes in (hits, balance, decision):
        axes.set_xscale("log", base=2)
        axes.set_xticks(engines, [str(n) for n in engines])
        axes.set_xlabel("engines")
        axes.legend(loc="best", fontsize="small")
    hits.set_ylabel("prompt tokens cached at dispatch / prompt tokens")
    hits.set_title("hit rate")
    balance.set_yscale("log")
    balance.set_ylabel("max / mean requests in flight")
    balance.set_title("load imbalance (averaged over dispatches)")
    decision.set_yscale("log")
    decision.set_ylabel("us per request")
    decision.set_title("kv-aware decision (the prompt's stretches + choose)")
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [
        (str(row["engines"]), row["policy"], f"{row['hit_rate']:.3f}", f"{row['imbalance']:.2f}",
         f"{row['ttft_p50_ms']:.1f}", f"{row['ttft_p90_ms']:.1f}",
         _maybe(row["decision_us_p50"]), _maybe(row["decision_us_p99"]))
        for row in document["rows"]
    ]  # fmt: skip
    engines = list(dict.fromkeys(row["engines"] for row in document["rows"]))
    command = (f"kvtier bench fleet --no-real --engines {' '.join(map(str, engines))} --trace "
               f"{document['trace']}")  # fmt: skip
    facts = tuple(
        (f"goal at {document['goals_at_engines']} engines, {goal['name']}",
         f"{goal['value']:.2f} (limit {goal['limit']:g}): {'PASS' if goal['passed'] else 'FAIL'}")
        for goal in document["goals"]
    )  # fmt: skip
    return Summary(f"kvtier bench fleet (simulated, {document['trace']} trace)", command,
                   ("engines", "policy", "hit rate", "imbalance", "TTFT p50 ms", "TTFT p90 ms",
                    "decision p50 µs", "decision p99 µs"), rows, facts)  # fmt: skip
