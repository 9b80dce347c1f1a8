"""``kvtier bench transfer``: its arguments; the benchmarks are ``run.py`` and, with ``--ttft``,
``ttft.py``."""

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
    from kvtier.apps.bench.transfer import run as transfer_bench

    transfer_bench.run(args.out, quick=args.quick)
    if args.ttft:
        from kvtier.apps.bench.transfer import ttft

        ttft.run(args.out, quick=args.quick)
    return 0


COMMAND = Command(
    "transfer",
    "prefill→decode throughput on loopback / a raw TCP stream of the same bytes",
    add_arguments,
    run,
    description="Pulls of the bench model's KV from a prefill process over loopback TCP, "
    "against raw TCP streams of the same bytes (and Mooncake's transfer engine when "
    "installed), in messages of 16, 64 and 256 tokens; with --ttft, the TTFT through kvtier "
    "proxy of a prefill and a decode kvtier serve against its parts. Writes transfer.json, "
    ".md, .png (and transfer-ttft.json, .md, .png).",
)
