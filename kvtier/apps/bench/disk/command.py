"""``kvtier bench disk``: its arguments; the benchmark is ``run.py``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=Path("."), help="makes (and removes) a temporary dir in DIR"
    )
    parser.add_argument("--chunks", type=int, default=64, help="chunk files per round")
    parser.add_argument("--layers", type=int, default=32, help="engine layers (4 MiB chunks at 32)")
    parser.add_argument("--rounds", type=int, default=9, help="throughput rounds (median)")
    parser.add_argument("--tokens", type=int, default=4096, help="prompt tokens for TTFT")
    parser.add_argument("--repeats", type=int, default=3, help="fresh prompts for TTFT (median)")
    parser.add_argument("--model", default="bench", help="TTFT: a local model's name or directory")
    parser.add_argument("--dtype", default="bfloat16", help="TTFT: the model's dtype")
    parser.add_argument("--device", default=None, help="engine device (default: cuda if present)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.common.engine_env import apply_in_process_env

    apply_in_process_env()
    from kvtier.apps.bench.common.models import model_arg
    from kvtier.apps.bench.disk import run as disk_bench

    disk_bench.run(
        args.out, args.dir, chunks=args.chunks, layers=args.layers, rounds=args.rounds,
        tokens=args.tokens, repeats=args.repeats, model=model_arg(args.model), dtype=args.dtype,
        device=args.device,
    )  # fmt: skip
    return 0


COMMAND = Command(
    "disk",
    "disk-tier throughput / raw sequential I/O; TTFT from disk / recompute / Example",
    add_arguments,
    run,
    description="Disk-tier store and load throughput against a dd-like sequential write and "
    "read of the same bytes on the same file system, and the TTFT of a prompt a restarted "
    "vLLM engine loads from disk, against recompute and vLLM's ExampleConnector. Writes "
    "disk-<device>.json, .md and .png.",
)
