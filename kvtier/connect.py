"""``connect(host, port, timeout_s)``: a TCP connection whose name lookup is bounded too.

``socket.create_connection`` bounds the connect by its timeout, but not the name lookup before
it: with a resolver that does not answer, glibc tries each nameserver for 5 s, twice, and a
Redis node or a prefill engine named by a host name would hold a loader thread that long. Here
the lookup runs on a daemon thread and is given up at the deadline (``ResolveTimeout``; the
thread ends when the resolver gives up). A numeric address needs no lookup and no thread.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Any

AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]


class ResolveTimeout(TimeoutError):
    """The host name was not resolved within the timeout."""


def connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """A connected TCP socket to ``host:port`` within ``timeout_s`` in all (lookup included);
    its timeout is left at ``timeout_s``. Raises ``ResolveTimeout``, ``socket.gaierror`` or the
    last address's ``OSError``."""
    deadline = time.monotonic() + timeout_s
    error: OSError | None = None
    for family, kind, proto, _, address in resolve(host, port, timeout_s):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(max(0.0, deadline - time.monotonic()) or 1e-3)
            sock.connect(address)
        except OSError as failure:
            sock.close()
            error = failure
            continue
        sock.settimeout(timeout_s)
        return sock
    raise error or OSError(f"no address for {host}:{port}")


def resolve(host: str, port: int, timeout_s: float) -> list[AddrInfo]:
    """``socket.getaddrinfo`` for a TCP connection, given up after ``timeout_s``."""
    numeric = _numeric(host)
    if numeric is not None:  # nothing to look up
        return [(numeric, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]
    found: list[AddrInfo] = []
    failed: list[OSError] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as error:
            failed.append(error)
        finally:
            done.set()

    threading.Thread(target=lookup, name="kvtier-resolve", daemon=True).start()
    if not done.wait(timeout_s):
        raise ResolveTimeout(f"resolving {host!r} took longer than {timeout_s} s")
    if failed:
        raise failed[0]
    return found


def _numeric(host: str) -> socket.AddressFamily | None:
    """The family of a numeric address; None for a name."""
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        return None
    return socket.AF_INET if version == 4 else socket.AF_INET6
