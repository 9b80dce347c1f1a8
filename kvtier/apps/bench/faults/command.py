"""``kvtier bench faults``: its arguments; the campaign is ``run.py``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvtier.apps.command import Command

QUICK_EXAMPLES, QUICK_STEPS = 1, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=20.0,
                        help="how long to run (one engine at least)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="the settings' order and faults")
    parser.add_argument("--quick", action="store_true",
                        help=f"each engine {QUICK_EXAMPLES} hypothesis example of {QUICK_STEPS} "
                        "steps (default 4 of 15; the first example is passes only); with a "
                        "small --minutes, one engine: a smoke run of the command")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    if args.minutes <= 0:  # the one bad argument; any other error is the campaign's, traced
        print(f"kvtier bench faults: --minutes must be > 0, got {args.minutes}", file=sys.stderr)
        return 2
    from kvtier.apps.bench.common.engine_env import apply_in_process_env

    apply_in_process_env()  # before vLLM is imported: the campaign's engines run in here
    from kvtier.apps.bench.faults import run as faults_bench

    if args.quick:
        return faults_bench.run(args.out, args.minutes, args.seed, QUICK_EXAMPLES, QUICK_STEPS)
    return faults_bench.run(args.out, args.minutes, args.seed)


COMMAND = Command(
    "faults",
    "a randomized fault campaign: outputs against the engine without kvtier",
    add_arguments,
    run,
    description="Drive engines with kvtier (disk and Redis tiers, host tiers tiny and "
    "roomy, synchronous and asynchronous reads) through passes, faults in their tiers, "
    "evictions, resets mid-load and restarts (a hypothesis state machine) for --minutes, "
    "comparing every output with the engine without kvtier. Writes faults.json, .md and "
    ".png; exits 1 on a wrong output.",
)
