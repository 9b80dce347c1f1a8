"""``kvtier bench copy``: its arguments; the benchmark is ``run.py``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=4096, help="tokens moved per job")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--device", default=None, help="engine device (default: cuda if present)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.copy import run as copy_bench

    copy_bench.run(args.out, tokens=args.tokens, rounds=args.rounds, device=args.device)
    return 0


COMMAND = Command(
    "copy",
    "host-tier copy throughput / plain torch copy",
    add_arguments,
    run,
    description="Host-tier store and load jobs of a request (the bench model's layout, "
    "shuffled engine blocks, host slots from kvtier's own manager under churn) through the "
    "real transfer worker, each against one plain torch copy of the same bytes timed just "
    "before it: chunks of 32, 64 and 256 tokens. Writes copy-<device>.json, .md and .png.",
)
