"""``kvtier bench transfer``: its arguments; the benchmarks are ``kvtier.apps.bench.transfer`` and,
with ``--ttft``, ``kvtier.apps.bench.transfer_ttft``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument(
        "--ttft",
        action="store_true",
        help="also the TTFT split through kvtier proxy (real engines, the bench model; minutes)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench import transfer as transfer_bench

    transfer_bench.run(args.out, quick=args.quick)
    if args.ttft:
        from kvtier.apps.bench import transfer_ttft

        transfer_ttft.run(args.out, quick=args.quick)
    return 0


COMMAND = Command(
    "transfer",
    "prefill→decode throughput on loopback / a raw TCP stream of the same bytes",
    add_arguments,
    run,
)
