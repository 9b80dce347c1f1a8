"""``kvtier bench faults``: its arguments; the campaign is ``kvtier.apps.bench.faults``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=20.0, help="how long to run")
    parser.add_argument("--seed", type=int, default=0, help="the settings' order and faults")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench import faults as faults_bench

    try:
        return faults_bench.run(args.out, args.minutes, args.seed)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2


COMMAND = Command(
    "faults",
    "a randomized fault campaign: outputs against the engine without kvtier",
    add_arguments,
    run,
    description="Drive engines with kvtier (disk and Redis tiers, host tiers tiny and "
    "roomy, synchronous and asynchronous reads) through passes, faults in their tiers, "
    "evictions, resets mid-load and restarts (a hypothesis state machine) for --minutes, "
    "comparing every output with the engine without kvtier. Exits 1 on a wrong output.",
)
