"""``kvtier proxy --prefill URL... --decode URL...``: one OpenAI-compatible endpoint in front of
prefill and decode engines (disaggregated serving; see ``kvtier.apps.proxy``).
``kvtier proxy --engine URL...``: in front of a fleet of engines, each request sent where its KV
already is (``--policy kv-aware``, the default), or by load (``fleet.py``)."""

from __future__ import annotations

import argparse
import logging
import sys

DEFAULT_HOST = "127.0.0.1"
POLICIES = ("kv-aware", "least-loaded", "round-robin")  # scoring.POLICIES (not imported: --help)
DEFAULT_PORT = 8000
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``proxy`` subcommand's options, on ``parser``."""
    for side, port in (("prefill", 8100), ("decode", 8200)):
        parser.add_argument(
            f"--{side}", nargs="+", action="extend", metavar="URL",
            help=f"{side} engine URL(s), e.g. http://127.0.0.1:{port} (list several, or repeat "
            "the option, to balance over them)",
        )  # fmt: skip
    parser.add_argument(
        "--engine", nargs="+", action="extend", metavar="URL",
        help="a fleet's engine URL(s) (kv_both; instead of --prefill/--decode): each request "
        "goes to one of them, chosen by --policy",
    )  # fmt: skip
    parser.add_argument(
        "--policy", choices=POLICIES, default="kv-aware",
        help="how --engine (or --prefill) picks one: kv-aware (where the prompt's KV is, against "
        "each engine's queue; found from the engines' KV events), least-loaded, round-robin",
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
        help="how often each prefill engine's (or fleet engine's) /health is asked; one that "
        "fails it is skipped until it passes again",
    )  # fmt: skip
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                        help="debug: a line per request, and uvicorn's access log")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. 2: a bad engine URL or limit (said on stderr)."""
    import uvicorn

    from kvtier.apps.proxy.app import build_app, build_fleet_app
    from kvtier.apps.proxy.config import FleetConfig

    try:
        if args.engine and (args.prefill or args.decode):
            raise ValueError("--engine excludes --prefill/--decode (a fleet, or a pair of sides)")
        if args.engine:
            config = FleetConfig(
                tuple(args.engine), args.policy, args.timeout_s, args.connect_timeout_s,
                args.backoff_s, args.health_interval_s,
            )  # fmt: skip
            app = build_fleet_app(config)
        elif not (args.prefill and args.decode):
            raise ValueError("give --engine URL..., or both --prefill URL... and --decode URL...")
        else:
            app = build_app(
                args.prefill, args.decode, timeout_s=args.timeout_s,
                connect_timeout_s=args.connect_timeout_s, backoff_s=args.backoff_s,
                prefill_timeout_s=args.prefill_timeout_s,
                health_interval_s=args.health_interval_s, policy=args.policy,
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
