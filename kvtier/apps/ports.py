"""TCP ports for servers started later (kvtier serve's KV event sockets, the tests' and the
benchmarks' servers), chosen where no outgoing connection can take them first.

    free_ports_on(host, count) -> int   the first of ``count`` ports in a row, free now
    free_port()                -> int   one port free on 127.0.0.1 now

A port is chosen now and bound by a process that starts seconds later. The kernel picks the
ports of outgoing connections from its ephemeral range (``ip_local_port_range``; 32768-60999 on
Linux): a port chosen there, as ``bind(0)`` chooses, can be taken meanwhile by any connection
the machine opens (a Redis client, an HTTP request), and the server then fails with "Address
already in use" (a test's engine did, once, beside a busy suite). So ports are drawn at random
from the ``SPAN`` ports below that range, which only explicit binds take, and checked free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

SPAN = 10_000  # ports below the ephemeral range to draw from
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_ports_on(host: str, count: int = 1, attempts: int = 256) -> int:
    """The first of ``count`` TCP ports in a row free on ``host`` now; ``OSError`` when
    ``attempts`` draws found none."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = _drawn_from()
    draw = random.Random()  # seeded from the system: processes started together draw apart
    for _ in range(attempts):
        first = draw.randrange(low, high - count + 1)
        if all(_free(family, host, port) for port in range(first, first + count)):
            return first
    raise OSError(f"no {count} TCP ports in a row free on {host!r} in [{low}, {high})")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    return free_ports_on("127.0.0.1")


def _drawn_from() -> tuple[int, int]:
    """[low, high): the ``SPAN`` ports below the ephemeral range (above it, if too low)."""
    try:
        first, last = map(int, _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        first, last = 32768, 60999  # Linux's default
    if first - SPAN >= 1024:
        return first - SPAN, first
    return last + 1, min(65536, last + 1 + SPAN)


def _free(family: socket.AddressFamily, host: str, port: int) -> bool:
    with socket.socket(family) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
