"""``kvtier proxy --prefill URL... --decode URL...``: one OpenAI-compatible endpoint in front of
prefill and decode engines (disaggregated serving; see ``kvtier.apps.proxy``).
``kvtier proxy --engine URL...``: in front of a fleet of engines, each request sent where its KV
already is (``--policy kv-aware``, the default), or by load (``fleet.py``)."""

from __future__ import annotations

import argparse
import logging
import socket
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
        "--connect-timeout-s", type=float, default=5.0, help="limit on connecting to an engine",
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
        help="how often each engine's /health is asked; one that fails it is skipped until it "
        "passes again",
    )  # fmt: skip
    parser.add_argument(
        "--health-timeout-s", type=float, default=3.0,
        help="a /health unanswered this long: the engine stalled (stopped, paused, wedged); the "
        "requests waiting on it for a first byte go to another engine",
    )  # fmt: skip
    parser.add_argument(
        "--first-byte-timeout-s", type=float, default=120.0,
        help="an engine that sent no byte of an answer this long after the request: the request "
        "goes to another engine",
    )  # fmt: skip
    parser.add_argument(
        "--retries", type=int, default=2,
        help="times a request goes to another engine when its engine dies or stalls before "
        "any byte of the answer reached the client",
    )  # fmt: skip
    parser.add_argument(
        "--hedge-after-p99", type=float, default=2.0,
        help="a request whose first byte is later than this x the recent 99th percentile goes "
        "to a second engine too, the first to answer serving it (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--reuse-port", action="store_true",
        help="listen with SO_REUSEPORT: a new proxy takes the port while the old one drains "
        "(a restart without refused connections: start the new one, then SIGTERM the old)",
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
                args.backoff_s, args.health_interval_s, args.health_timeout_s,
                args.first_byte_timeout_s, args.retries, args.hedge_after_p99,
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
                health_timeout_s=args.health_timeout_s,
                first_byte_timeout_s=args.first_byte_timeout_s, retries=args.retries,
                hedge_after_p99=args.hedge_after_p99,
            )  # fmt: skip
    except ValueError as exc:
        print(f"kvtier proxy: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    if args.log_level != "debug":  # httpx logs every request it sends at INFO
        logging.getLogger("httpx").setLevel(logging.WARNING)
    server = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            access_log=args.log_level == "debug")  # fmt: skip
    sockets = [listening(args.host, args.port)] if args.reuse_port else None
    uvicorn.Server(server).run(sockets=sockets)
    return 0


def listening(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` with SO_REUSEPORT (and SO_REUSEADDR)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    sock = socket.socket(family, kind, proto)  # IPPROTO_TCP: asyncio sets TCP_NODELAY on it
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
