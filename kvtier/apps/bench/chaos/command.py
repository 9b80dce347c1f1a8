"""``kvtier bench chaos``: its arguments; the benchmark is ``run.py``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from kvtier.apps.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engines", type=int, help="kv_both engines behind the fleet proxy "
                        "(default 2)")  # fmt: skip
    parser.add_argument("--minutes", type=float, help="of load (default 30; --quick: 2)")
    parser.add_argument("--seed", type=int, help="the faults and the workload (default 0)")
    parser.add_argument("--rate", type=float, help="requests sent per second (default 1; "
                        "--quick: 2)")  # fmt: skip
    parser.add_argument("--in-flight", type=int, help="at most this many unanswered (default 4)")
    parser.add_argument("--model", help="the engines' model: a local model's name or directory "
                        "(default tiny)")  # fmt: skip
    parser.add_argument("--no-pd", action="store_true",
                        help="without the prefill→decode pair and its proxy")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="the short form: every fault kind once, short gaps and stalls, "
                        "2 minutes")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--logs", type=Path, help="keep the servers' logs in this folder")


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.chaos import run as chaos
    from kvtier.apps.bench.chaos.settings import ChaosSettings

    given = {"engines": args.engines, "minutes": args.minutes, "seed": args.seed,
             "rate": args.rate, "in_flight": args.in_flight, "model": args.model}  # fmt: skip
    chosen = {key: value for key, value in given.items() if value is not None}
    try:
        settings = ChaosSettings.quick(**chosen) if args.quick else ChaosSettings(**chosen)
        if args.no_pd:
            settings = replace(settings, pd=False)
    except (TypeError, ValueError) as error:
        print(error, file=sys.stderr)
        return 2
    return chaos.run(args.out, settings, args.logs)


COMMAND = Command(
    "chaos",
    "a fleet under steady load while engines, Redis and the proxy fail: client errors, "
    "answers against one engine's",
    add_arguments,
    run,
    description="Start Redis, --engines kvtier serve engines (kv_both, a host tier and the "
    "shared Redis tier) behind kvtier proxy --engine --policy kv-aware, and a prefill→decode "
    "pair behind a second proxy (unless --no-pd). Send a multi-round chat and long documents "
    "at --rate for --minutes (streamed and not, greedy) while seeded faults come one at a "
    "time: an engine SIGKILLed and started again, an engine SIGSTOPped for 5-20 s, Redis "
    "killed and started empty, Redis SIGSTOPped, the proxy restarted, an engine's caches "
    "reset behind the proxy. Then ask every prompt of one engine without kvtier. Reports "
    "requests sent, answered and failed (why), reconnects, answers identical to the "
    "reference, requests past their timeout, TTFT p50/p99 per phase, every process's memory "
    "growth and kvtier's served share around each fault, against issue 39's acceptance. "
    "Writes chaos.json, .md and .png; exits 1 on a client error, a different answer, a "
    "request past its timeout or a fault not done.",
)
