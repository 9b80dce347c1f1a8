"""``kvtier proxy --prefill URL... --decode URL...``: one OpenAI-compatible endpoint in front of
prefill and decode engines (disaggregated serving; see ``kvtier.apps.proxy``)."""

from __future__ import annotations

import argparse
import logging
import sys

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``proxy`` subcommand's options, on ``parser``."""
    for side, port in (("prefill", 8100), ("decode", 8200)):
        parser.add_argument(
            f"--{side}", nargs="+", action="extend", required=True, metavar="URL",
            help=f"{side} engine URL(s), e.g. http://127.0.0.1:{port} (list several, or repeat "
            "the option, to balance over them)",
        )  # fmt: skip
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--timeout-s", type=float, default=300.0,
        help="limit on a whole request, prefill and decode stream included",
    )  # fmt: skip
    parser.add_argument(
        "--connect-timeout-s", type=float, default=5.0,
        help="limit on connecting to an engine (and on its /health)",
    )  # fmt: skip
    parser.add_argument(
        "--backoff-s", type=float, default=2.0,
        help="an engine that could not be connected to (or a prefill engine that failed) is "
        "skipped this long",
    )  # fmt: skip
    parser.add_argument(
        "--prefill-timeout-s", type=float, default=60.0,
        help="limit on the prefill hop, within --timeout-s: past it (or when the prefill engine "
        "fails, or none is up) the decode engine computes the prompt itself",
    )  # fmt: skip
    parser.add_argument(
        "--health-interval-s", type=float, default=2.0,
        help="how often each prefill engine's /health is asked; one that fails it is skipped "
        "until it passes again",
    )  # fmt: skip
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                        help="debug: a line per request, and uvicorn's access log")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. 2: a bad engine URL or limit (said on stderr)."""
    import uvicorn

    from kvtier.apps.proxy.app import build_app

    try:
        app = build_app(
            args.prefill, args.decode, timeout_s=args.timeout_s,
            connect_timeout_s=args.connect_timeout_s, backoff_s=args.backoff_s,
            prefill_timeout_s=args.prefill_timeout_s, health_interval_s=args.health_interval_s,
        )  # fmt: skip
    except ValueError as exc:
        print(f"kvtier proxy: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    if args.log_level != "debug":  # httpx logs every request it sends at INFO
        logging.getLogger("httpx").setLevel(logging.WARNING)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                access_log=args.log_level == "debug")  # fmt: skip
    return 0
