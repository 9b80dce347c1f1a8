"""Error replies of a Redis server as typed exceptions, and the connection's own failures.

RespError            any error reply: the server understood and refused; the connection
                     stays in step
  MovedError         ``-MOVED slot host:port``: the slot is served by another node now
    AskError         ``-ASK slot host:port``: ask that node once, after ``ASKING``
  AuthError          ``-NOAUTH`` / ``-WRONGPASS``: credentials missing or refused
  OutOfMemoryError   ``-OOM``: at ``maxmemory``, nothing may be evicted: a refused write
ProtocolError        the peer does not speak RESP2 (a ConnectionError: the connection is
                     closed)
TlsHandshakeError    the TLS handshake failed (a plain port answers none)
"""

from __future__ import annotations


class RespError(Exception):
    """An error reply: the server understood, and refused (the connection stays in step)."""


class MovedError(RespError):
    """``-MOVED slot host:port``: the slot lives on another node of the cluster now."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        _, slot, where = text.split()
        host, _, port = where.rpartition(":")
        self.slot, self.host, self.port = int(slot), host, int(port)


class AskError(MovedError):
    """``-ASK slot host:port``: this key is being migrated; ask that node, once, after ASKING."""


class AuthError(RespError):
    """``-NOAUTH``/``-WRONGPASS``: credentials missing or refused."""


class OutOfMemoryError(RespError):
    """``-OOM``: the server is at ``maxmemory`` and may not evict (a refused write)."""


class ProtocolError(ConnectionError):
    """The peer sent something that is not a RESP2 reply."""


class TlsHandshakeError(ConnectionError):
    """The TLS handshake failed (a plain port answers none), certificates aside."""


def error_reply(text: str) -> RespError:
    """The typed exception of an error reply's text (without its ``-``)."""
    word = text.split(" ", 1)[0]
    try:
        if word == "MOVED":
            return MovedError(text)
        if word == "ASK":
            return AskError(text)
    except ValueError:
        return RespError(text)
    if word in ("NOAUTH", "WRONGPASS") or "invalid password" in text:
        return AuthError(text)
    if word == "OOM":
        return OutOfMemoryError(text)
    return RespError(text)
