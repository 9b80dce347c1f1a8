"""``kvtier bench gpu``: its arguments; the benchmark is ``kvtier.apps.bench.gpu``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtier.apps.command import Command

QUICK_REPS, FULL_REPS = 3, 7


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help=f"the 8b and bench shapes, {QUICK_REPS} reps, a small matmul loop "
                        "(about 2 minutes on an H100)")  # fmt: skip
    parser.add_argument("--shapes", default=None,
                        help="comma-separated: 8b, 70b-tp8, mla, hybrid, bench, tiny "
                        "(default: all but tiny; --quick: 8b,bench)")  # fmt: skip
    parser.add_argument("--reps", type=int, default=None,
                        help=f"repetitions of each figure (default {FULL_REPS}; "
                        f"--quick: {QUICK_REPS})")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=4096, help="tokens of the request")
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--measures", default=None,
                        help="comma-separated subset of host, prefill, beside, launches, disk, "
                        "redis, pull, pinning (default: all)")  # fmt: skip
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the disk measure makes its temporary files (default: OUT/tmp)",
    )
    parser.add_argument(
        "--redis-url", default=None, help="a running Redis to use (default: start a redis-server)"
    )
    parser.add_argument("--limit-s", type=float, default=None,
                        help="a measure running longer is interrupted, its figures null, the "
                        "rest go on (default 240 s; --quick: 120 s)")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=None,
                        help="the whole run's seconds: a measure gets at most what is left, "
                        "none starts past it (their figures null); the tables are still "
                        "written (default: no bound)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench/results"),
                        help="gpu.json, gpu.png and gpu.md are written here")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from kvtier.apps.bench.gpu import run as gpu_bench
    from kvtier.apps.bench.gpu.shapes import FULL_SHAPES, QUICK_SHAPES, parse_shapes

    shapes: tuple[str, ...] = QUICK_SHAPES if args.quick else FULL_SHAPES
    try:
        if args.shapes is not None:
            shapes = parse_shapes(args.shapes)
        measures = gpu_bench.MEASURES
        if args.measures is not None:
            measures = tuple(m.strip() for m in args.measures.split(",") if m.strip())
            unknown = sorted(set(measures) - set(gpu_bench.MEASURES))
            if unknown:
                raise ValueError(f"--measures: unknown {unknown}; valid: "
                                 f"{', '.join(gpu_bench.MEASURES)}")  # fmt: skip
        reps = args.reps or (QUICK_REPS if args.quick else FULL_REPS)
        if reps < 1:
            raise ValueError(f"--reps must be at least 1, got {reps}")
        if args.budget_s is not None and args.budget_s <= 0:
            raise ValueError(f"--budget-s must be positive, got {args.budget_s}")
    except ValueError as error:
        print(f"kvtier bench gpu: {error}")
        return 2
    options = gpu_bench.Options(
        out=args.out, shapes=shapes, reps=reps, quick=args.quick, device=args.device,
        tokens=args.tokens, measures=measures, disk_dir=args.dir, redis_url=args.redis_url,
        limit_s=args.limit_s or (120.0 if args.quick else 240.0), budget_s=args.budget_s,
    )  # fmt: skip
    gpu_bench.run(options)
    return 0


COMMAND = Command(
    "gpu",
    "kvtier's CUDA paths on a 4,096-token request, each / its bound (host, disk, Redis, pull)",
    add_arguments,
    run,
    description="For each shape (8b, 70b-tp8, mla, hybrid, bench), a 4,096-token request in "
    "scattered engine blocks and host slots: host-tier store and load per mechanism (dma, "
    "kernel) / one contiguous pinned copy; the host load / the prefill of the same tokens; a "
    "bf16 matmul loop with stores and loads beside it / alone; disk load warm and cold / read + "
    "one host->device copy; Redis load / a raw loopback stream; the peer's pull / raw TCP; the "
    "host tier's pinning rate. Writes gpu.json, gpu.png and gpu.md; a measure that fails records "
    "its error and the rest go on. --device cpu runs the same code on CPU tensors.",
)
