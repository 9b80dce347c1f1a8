"""``kvtier bench fleet``: where the proxy sends requests, and what that saves.

    run(out, real=RealWork() | None, sim_engines=(16, 64, 256) | (), sim_trace="chat" | "mrqa")

Real (``real/``): two ``kvtier serve`` engines behind ``kvtier proxy --engine`` on this
machine, each policy on a multi-round chat and a long-document QA; writes ``fleet.json``, ``.md``
and ``.png``. Simulated (``sim/``): the proxy's own index and scorer over 16, 64 and 256
engines; writes ``fleet-sim.json``, ``.md`` and ``.png`` (``fleet-sim-<trace>.*`` for a trace
but the chat).
"""

from __future__ import annotations

from pathlib import Path

from kvtier.apps.bench.fleet.real.fleet import RealWork

REAL = RealWork()  # the full run


def run(
    out: Path,
    real: RealWork | None = REAL,
    sim_engines: tuple[int, ...] = (),
    sim_trace: str = "chat",
) -> None:
    if real is not None:
        from kvtier.apps.bench.fleet.real.run import run_real

        run_real(out, real)
    if sim_engines:
        from kvtier.apps.bench.fleet.sim.run import run_sim

        run_sim(out, engines=sim_engines, trace=sim_trace)
