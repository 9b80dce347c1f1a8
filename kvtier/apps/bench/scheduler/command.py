"""``kvtier bench scheduler``: its arguments; the benchmark is ``run.py``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--running", type=int, nargs="+", default=[32, 256, 1024], help="running requests"
    )
    parser.add_argument("--steps", type=int, default=200, help="measured steps")
    parser.add_argument("--warmup", type=int, default=64, help="steps before measuring")
    parser.add_argument("--context", type=int, default=4096, help="prompt tokens")
    parser.add_argument(
        "--no-compare", action="store_true", help="skip the whole-table mode (the old cost)"
    )
    parser.add_argument(
        "--adapter",
        action="store_true",
        help="also time vLLM's SchedulerOutput through the adapter (imports vLLM)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.scheduler import run as scheduler_bench

    scheduler_bench.run(
        args.out, running=tuple(args.running), steps=args.steps, warmup=args.warmup,
        context=args.context, compare=not args.no_compare, adapter=args.adapter,
    )  # fmt: skip
    return 0


COMMAND = Command(
    "scheduler",
    "the scheduler half's cost per engine step / a bare loop over the new blocks",
    add_arguments,
    run,
    description="Drive kvtier's scheduler half (no engine) with RUNNING requests of "
    "--context-token contexts decoding, finishing and arriving (prefills with hits), and "
    "time its calls each step against a bare loop over the step's new block ids; also, "
    "unless --no-compare, with every request's whole table handed over each step. Writes "
    "scheduler.json, .md and .png.",
)
