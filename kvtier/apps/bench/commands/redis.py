"""``kvtier bench redis``: its arguments; the benchmark is ``kvtier.apps.bench.redis``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="16 MiB a round, 3 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="after a warm-up (9)")
    parser.add_argument("--device", default=None, help="engine device (cuda if present)")
    parser.add_argument("--url", default=None, help="a running Redis instead of a new one")
    parser.add_argument(
        "--server", choices=("redis", "valkey"), default=None,
        help="the server to start (default: redis-server, else valkey-server)",
    )  # fmt: skip
    parser.add_argument(
        "--ttft", action="store_true", help="also TTFT of a 4k prompt from Redis (minutes)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench import redis as redis_bench

    redis_bench.run(args.out, quick=args.quick, rounds=args.rounds, device=args.device,
                    url=args.url, ttft=args.ttft, server=args.server)  # fmt: skip
    return 0


COMMAND = Command(
    "redis", "the Redis tier vs redis-py and a raw TCP stream (loopback); TTFT", add_arguments, run
)
