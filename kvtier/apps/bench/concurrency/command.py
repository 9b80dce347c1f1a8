"""``kvtier bench concurrency``: its arguments; the benchmark is ``run.py``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="the rounds part small: 8 prompts of 64 tokens, 4 out, 3 rounds, 1 "
                        "pair, kvtier and none only (seconds a round)")  # fmt: skip
    parser.add_argument("--pairs", type=int, help="pairs of the rounds part (default 3)")
    parser.add_argument(
        "--rounds", type=int, help="rounds per pair, the first a warm-up (default 6)"
    )
    parser.add_argument(
        "--served-pairs", type=int, help="long-miss pairs, after a warm-up pair (default 6)"
    )
    parser.add_argument("--no-rounds", action="store_true", help="skip the rounds part")
    parser.add_argument("--no-served", action="store_true", help="skip the long-miss part")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.common.engine_env import apply_in_process_env

    apply_in_process_env()
    from kvtier.apps.bench.concurrency import run as concurrency

    rounds = concurrency.QUICK if args.quick else concurrency.ROUNDS
    long_miss = concurrency.LONG_MISS
    if args.pairs is not None:
        rounds = replace(rounds, pairs=args.pairs)
    if args.rounds is not None:
        rounds = replace(rounds, rounds=args.rounds)
    if args.served_pairs is not None:
        long_miss = replace(long_miss, pairs=args.served_pairs)
    concurrency.run(args.out, rounds=None if args.no_rounds else rounds,
                    long_miss=None if args.no_served else long_miss)  # fmt: skip
    return 0


COMMAND = Command(
    "concurrency",
    "0%%-hit throughput at 512 concurrent requests and a served long miss, kvtier / none",
    add_arguments,
    run,
    description="Rounds of 512 never-seen 96-token prompts at once (the tiny model, "
    "max_num_seqs 512, 32 tokens out) in engine processes with and without kvtier (a host tier "
    "only), alive together, each round served by each in turn: the throughput ratio, the median "
    "of the rounds' after the first (goal >= 0.97); beside them kvtier with a 64 MiB host tier "
    "(full after the first round: the same ratio without the first fill), and vLLM with a "
    "connector that does nothing (the bound: what vLLM costs an engine with any connector). Then "
    "never-seen ~3,000-token documents, 2 in flight, "
    "through kvtier serve and vLLM's server alone (the bench model), pairs alternated: the mean "
    "TTFT ratio (goal <= 1.02). Prints min/median/max with PASS/FAIL; writes concurrency.json, "
    ".md and .png.",
)
