"""``kvtier bench fleet``'s simulated half: the proxy's own index and scorer over large fleets.

    run_sim(out, engines=(16, 64, 256), seed=0, trace="chat", ...) -> dict   every size and
                                      policy; prints a table and the goals; writes
                                      fleet-sim.json, .md, .png (fleet-sim-<trace>.* for
                                      another trace of ``trace.TRACES``)
    simulate(engines, seed=0, ...)   -> [row]                  one fleet size, each policy

No engine runs: ``engine.SimEngine`` stands for one (a GPU prefix cache, kvtier's host
tier, a FIFO prefill queue, its KV events), ``trace`` draws multi-round chats (seeded:
the same seed, the same trace for every policy), and ``loop.FleetSim`` routes them
with ``round-robin``, ``least-loaded``, ``kv-aware`` (``PrefixIndex`` and ``scoring.choose``,
unchanged: the point is to measure them) and ``oracle`` (the engines' actual caches). Sessions
scale with the fleet (``sessions_per_engine``), so each engine stays about as loaded at every
size, and the fleet's caches hold each engine's share of the conversations but not every
conversation on every engine (what round-robin would need).

Goals, at 64 engines (``report``): kv-aware's hit rate >= 0.9 x the oracle's and
>= 2 x round-robin's; its load imbalance <= 1.25; its decision p99 <= 100 us.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from kvtier.apps.bench.common.results import document as new_document
from kvtier.apps.bench.common.results import write
from kvtier.apps.bench.fleet.sim import report
from kvtier.apps.bench.fleet.sim.engine import EngineSpec
from kvtier.apps.bench.fleet.sim.loop import POLICIES, FleetSim
from kvtier.apps.bench.fleet.sim.trace import TRACES, Workload

ENGINES = (16, 64, 256)
GOAL_ENGINES = 64


def simulate(
    engines: int,
    seed: int = 0,
    workload: Workload | None = None,
    spec: EngineSpec | None = None,
    policies: Sequence[str] = POLICIES,
) -> list[dict[str, Any]]:
    """One row per policy: the same trace through a fleet of ``engines``."""
    workload, spec = workload or Workload(), spec or EngineSpec()
    return [FleetSim(policy, engines, workload, spec, seed).run() for policy in policies]


def run_sim(
    out: Path,
    engines: Sequence[int] = ENGINES,
    seed: int = 0,
    workload: Workload | None = None,
    spec: EngineSpec | None = None,
    console: Console | None = None,
    trace: str = "chat",
) -> dict[str, Any]:
    """Simulate every size in ``engines`` on ``trace`` (``workload``: another shape under its
    name), print the table and the goals (judged at 64 engines, or the largest size below it),
    write ``fleet-sim.json``, ``.md`` and ``.png`` under ``out`` (``fleet-sim-<trace>.*`` for a
    trace but the chat); the JSON document."""
    if not engines:
        raise ValueError("engines: at least one fleet size")
    if trace not in TRACES:
        raise ValueError(f"trace must be one of {', '.join(TRACES)}; got {trace!r}")
    workload, spec = workload or TRACES[trace], spec or EngineSpec()
    started = time.perf_counter()
    rows = [row for n in engines for row in simulate(n, seed, workload, spec)]
    judged_at = GOAL_ENGINES if GOAL_ENGINES in engines else max(engines)
    judged = report.goals(rows, judged_at)
    document = new_document(
        "fleet-sim", rows, torch_too=False, seed=seed, trace=trace, workload=asdict(workload),
        engine=asdict(spec), runtime_s=round(time.perf_counter() - started, 1),
        goals_at_engines=judged_at, goals=[goal._asdict() for goal in judged],
        # the most any router reaches, over round-robin's hit rate (``report.ceiling``)
        ceiling_over_round_robin=report.ceiling(rows, judged_at),
    )  # fmt: skip
    name = "fleet-sim" if trace == "chat" else f"fleet-sim-{trace}"
    write(out / f"{name}.json", document, report.summary, indent=1)
    report.plot(rows, out / f"{name}.png")
    console = console or Console(width=max(180, Console().width))  # 15 columns: none elided
    report.print_table(rows, judged, judged_at, console)
    console.print(f"simulated ({trace} trace) in {document['runtime_s']} s")
    return document
