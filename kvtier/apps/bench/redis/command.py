"""``kvtier bench redis``: its arguments; the benchmark is ``run.py``."""

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
    parser.add_argument("--ttft-tokens", type=int, default=4096, help="TTFT: prompt tokens")
    parser.add_argument("--ttft-repeats", type=int, default=3, help="TTFT: fresh prompts (median)")
    parser.add_argument("--model", default="bench", help="TTFT: a local model's name or directory")
    parser.add_argument("--dtype", default="bfloat16", help="TTFT: the model's dtype")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.common.engine_env import apply_in_process_env

    apply_in_process_env()
    from kvtier.apps.bench.common.models import model_arg
    from kvtier.apps.bench.redis import run as redis_bench
    from kvtier.apps.bench.redis.ttft import TTFTOptions

    options = TTFTOptions(args.ttft_tokens, args.ttft_repeats, model_arg(args.model), args.dtype)
    redis_bench.run(args.out, quick=args.quick, rounds=args.rounds, device=args.device,
                    url=args.url, ttft=args.ttft, server=args.server,
                    ttft_options=options)  # fmt: skip
    return 0


COMMAND = Command(
    "redis",
    "the Redis tier vs redis-py and a raw TCP stream (loopback); TTFT",
    add_arguments,
    run,
    description="The Redis tier's store and load throughput against redis-py's pipelined SET "
    "and GET and a raw loopback TCP stream of the same bytes (16, 64 and 256-token chunks), "
    "and with --ttft the TTFT of a prompt another engine serves from Redis, against recompute "
    "and the host tier. Writes redis.json, redis.md and redis.png.",
)
