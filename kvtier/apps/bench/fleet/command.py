"""``kvtier bench fleet``: its arguments; the benchmark is ``run.py``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from kvtier.apps.bench.fleet.sim.trace import TRACES
from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, help="real part: runs of every policy (default 2)")
    parser.add_argument("--model", help="real part: the engines' model (default bench)")
    parser.add_argument("--dtype", help="real part: its dtype (default float32)")
    parser.add_argument(
        "--engines", type=int, nargs="+", default=[16, 64, 256], help="simulated fleet sizes"
    )
    parser.add_argument(
        "--trace",
        choices=tuple(TRACES),
        default="chat",
        help="simulated part: the trace (mrqa: LMCache's multi_round_qa proportions)",
    )
    parser.add_argument("--no-real", action="store_true", help="skip the real part")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulated part")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.fleet import run as fleet

    real = fleet.REAL
    for key in ("repeats", "model", "dtype"):
        if getattr(args, key) is not None:
            real = replace(real, **{key: getattr(args, key)})
    fleet.run(args.out, real=None if args.no_real else real,
              sim_engines=() if args.no_sim else tuple(args.engines),
              sim_trace=args.trace)  # fmt: skip
    return 0


COMMAND = Command(
    "fleet",
    "kvtier proxy's policies on two real engines, and its index and scorer simulated at scale",
    add_arguments,
    run,
    description="Two kvtier serve engines (the bench model, each on a core, caches smaller "
    "than the workload) behind kvtier proxy --engine: a multi-round chat (12 users, 6 rounds) "
    "and a long-document QA (6 documents read 3 times) through round-robin, least-loaded and "
    "kv-aware: TTFT p50/p90, requests/s, prompt tokens computed (goal: the chat's TTFT p50 "
    "with kv-aware <= 0.6 x round-robin's). Then the proxy's own index and scorer over 16, 64 "
    "and 256 simulated engines against an oracle, on a chat trace (or --trace mrqa: LMCache's "
    "multi_round_qa proportions). Writes fleet.json/.md/.png and fleet-sim.json/.md/.png "
    "(fleet-sim-mrqa.json/.md/.png).",
)
