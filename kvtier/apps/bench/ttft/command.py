"""``kvtier bench ttft``: its arguments; the benchmark is ``run.py``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="1024 and 1000 tokens, 3 repeats, 4 throughput pairs")  # fmt: skip
    parser.add_argument("--lengths", type=int, nargs="+",
                        help="prompt lengths of every row (default 1024 2048 4096)")  # fmt: skip
    parser.add_argument("--unaligned", type=int, nargs="*",
                        help="more lengths for the hit rows (default 1000 2000 4000)")  # fmt: skip
    parser.add_argument("--repeats", type=int, help="fresh prompts per length (default 5)")
    parser.add_argument("--chunk-tokens", type=int, default=64,
                        help="kvtier's chunk (its block_size), a multiple of 32")  # fmt: skip
    parser.add_argument("--pairs", type=int, help="throughput pairs, at least (default 10)")
    parser.add_argument("--max-pairs", type=int,
                        help="more pairs while the spread is above 2%% (default 40)")  # fmt: skip
    parser.add_argument("--prompts", type=int, help="throughput: prompts per batch (default 8)")
    parser.add_argument("--prompt-tokens", type=int,
                        help="throughput: tokens per prompt (default 512)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int,
                        help="throughput: tokens out per prompt (default 16)")  # fmt: skip
    parser.add_argument("--model", default="bench", help="a local model's name or directory")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.common.engine_env import apply_in_process_env

    apply_in_process_env()
    from kvtier.apps.bench.common.models import model_arg
    from kvtier.apps.bench.ttft import run as ttft_bench

    sizes = ttft_bench.options(
        args.quick, lengths=args.lengths, unaligned=args.unaligned, repeats=args.repeats,
        pairs=args.pairs, max_pairs=args.max_pairs, prompts=args.prompts,
        tokens=args.prompt_tokens, max_tokens=args.max_tokens,
    )  # fmt: skip
    ttft_bench.run(args.out, model=model_arg(args.model), dtype=args.dtype,
                   chunk_tokens=args.chunk_tokens, **sizes)  # fmt: skip
    return 0


COMMAND = Command(
    "ttft",
    "TTFT of kvtier hits in vLLM; no regret: kvtier on / off, kvtier hit / own hit",
    add_arguments,
    run,
    description="Engines with no connector, kvtier and ExampleConnector, alive together, "
    "requests interleaved: TTFT of recompute, the engine's own prefix-cache hit (kvtier off "
    "and on), a kvtier hit and an Example hit; the 0%-hit throughput with kvtier / without "
    "in interleaved pairs. Prints each no-regret ratio with its goal and PASS/FAIL; writes "
    "ttft-cpu.json, ttft-cpu.md and ttft-cpu.png (about 10 minutes; --quick about 2).",
)
