"""The ``kvtier`` command: ``kvtier demo``, ``kvtier bench copy``."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvtier", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="multi-round chat in vLLM on the CPU, without and with kvtier"
    )
    demo.add_argument("--users", type=int, default=6)
    demo.add_argument("--rounds", type=int, default=5)
    demo.add_argument("--out", type=Path, default=Path("bench/results"), help="dir for demo.png")

    bench = commands.add_parser("bench", help="benchmarks; each prints ratios to a bound")
    which = bench.add_subparsers(dest="bench", required=True)
    copy = which.add_parser("copy", help="host-tier copy throughput / plain torch copy")
    copy.add_argument("--tokens", type=int, default=4096, help="tokens moved per job")
    copy.add_argument("--rounds", type=int, default=15)
    copy.add_argument("--device", default=None, help="engine device (default: cuda if present)")
    copy.add_argument("--out", type=Path, default=Path("bench/results"))
    ttft = which.add_parser("ttft", help="TTFT of a kvtier hit in vLLM / the engine's own hit")
    ttft.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    ttft.add_argument("--repeats", type=int, default=5, help="fresh prompts per length (median)")
    ttft.add_argument("--out", type=Path, default=Path("bench/results"))

    args = parser.parse_args(argv)
    if args.command == "demo":
        from kvtier import demo as demo_module

        warnings.filterwarnings("ignore", ".*torch.distributed.reduce_op", FutureWarning)
        results = demo_module.run(users=args.users, rounds=args.rounds, out_dir=args.out)
        return 0 if all(r.identical for r in results) else 1
    elif args.bench == "copy":
        from kvtier.bench import copy as copy_bench

        copy_bench.run(args.out, tokens=args.tokens, rounds=args.rounds, device=args.device)
    elif args.bench == "ttft":
        from kvtier.bench import ttft as ttft_bench

        ttft_bench.run(args.out, lengths=tuple(args.lengths), repeats=args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
