"""The start-up check of one Redis URL: connect, log in, PING, and the right mode; and
whether a node answers again (``answers``: after a restart).

A failure is a ``ValueError`` that starts ``kvtier: 'redis.url'`` (or ``'redis.seeds'``) and
says the cause in a user's words: nothing listening, no answer in time, credentials refused
(and where a password comes from), a TLS URL to a plain port or a plain URL to a TLS port, a
certificate not trusted (``redis.tls_ca``), a database that does not exist, a cluster node
configured as a plain server or the reverse. Every step is bounded by ``timeout_s``; no
password is ever shown.
"""

from __future__ import annotations

import os
import socket
import ssl

from kvtier.connect import ResolveTimeout
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.conn import Connection
from kvtier.tiers.redis.errors import AuthError, ProtocolError, RespError, TlsHandshakeError
from kvtier.tiers.redis.url import RedisAddress


def answers(address: RedisAddress, timeout_s: float, tls: ssl.SSLContext | None) -> bool:
    """Whether ``address`` answers a PING on a new connection within ``timeout_s``."""
    try:
        probe = Connection(address, timeout_s, tls)
    except (OSError, AuthError):
        return False
    try:
        return bool(probe.call(b"PING"))
    except (OSError, AuthError, RespError):
        return False
    finally:
        probe.close()


def check_node(
    address: RedisAddress, key: str, config: RedisConfig, tls: ssl.SSLContext | None
) -> None:
    """ValueError naming ``key`` unless ``address`` answers as ``config`` expects."""
    try:
        conn = Connection(address, config.timeout_s, tls)
        try:
            conn.call(b"PING")
            info = conn.call(b"INFO", b"cluster")
            state = conn.call(b"CLUSTER", b"INFO") if b"cluster_enabled:1" in info else b""
        finally:
            conn.close()
    except (OSError, RespError) as error:
        raise ValueError(f"kvtier: {key!r}: {explain(error, address, config)}") from None
    where = address.describe()
    if config.cluster and not state:
        raise ValueError(f"kvtier: {key!r}: {where} is not in cluster mode; set 'redis.cluster' "
                         "to false, or give the URL of a Redis Cluster node")  # fmt: skip
    if not config.cluster and state:
        raise ValueError(f"kvtier: {key!r}: {where} is a Redis Cluster node; set "
                         "'redis.cluster' to true (and other nodes in 'redis.seeds')")  # fmt: skip
    if state and b"cluster_state:ok" not in state:
        raise ValueError(f"kvtier: {key!r}: the Redis Cluster of {where} is not serving "
                         "(cluster_state is not ok): are all its slots assigned?")  # fmt: skip


def explain(error: BaseException, address: RedisAddress, config: RedisConfig) -> str:
    """What went wrong reaching ``address``, for a person."""
    where = address.describe()
    if isinstance(error, ssl.SSLCertVerificationError):
        fix = (f"it is not signed by the CA in 'redis.tls_ca' ({config.tls_ca})" if config.tls_ca
               else "set 'redis.tls_ca' to the file of the CA that signed it")  # fmt: skip
        return f"the TLS certificate of {where} is not trusted ({error.verify_message}): {fix}"
    if isinstance(error, ssl.SSLError | TlsHandshakeError):
        return (f"the TLS handshake with {where} failed ({error}): is it a plain port? "
                "A plain port needs redis://, a TLS port rediss://")  # fmt: skip
    if isinstance(error, AuthError):
        env = config.password_env
        given = f"the environment variable {env} " + ("is set" if os.environ.get(env) else "is not")
        if str(error).startswith("NOAUTH"):
            return (f"{where} requires a password (NOAUTH): give it in the URL "
                    f"(redis://:PASSWORD@host) or in the environment variable {env}")  # fmt: skip
        return (f"{where} refused the user or password ({str(error).split(' ', 1)[0]}): check "
                f"the URL's (redis://USER:PASSWORD@host), or else {env} ({given})")  # fmt: skip
    if isinstance(error, RespError) and "DB index" in str(error):
        return f"database {address.db} does not exist on {where} ({error})"
    if isinstance(error, RespError) and "SELECT" in str(error):
        return f"a Redis Cluster has database 0 only; {where} names database {address.db}"
    if isinstance(error, RespError):
        return f"{where} answered an error: {error}"
    if isinstance(error, ConnectionRefusedError):
        return f"nothing listens at {where} (connection refused)"
    if isinstance(error, ResolveTimeout):
        return (f"cannot resolve the host of {where} within 'redis.timeout_s' "
                f"({config.timeout_s} s): is the DNS server answering?")  # fmt: skip
    if isinstance(error, TimeoutError):
        return f"no answer from {where} within 'redis.timeout_s' ({config.timeout_s} s)"
    if isinstance(error, ConnectionResetError | BrokenPipeError | ProtocolError):
        hint = "" if address.tls else ": is it a TLS port? A TLS port needs rediss://"
        return f"{where} closed the connection or answered something not Redis ({error}){hint}"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the host of {where} ({error})"
    if isinstance(error, FileNotFoundError):
        return f"no socket at {address.path}"
    return f"cannot reach {where} ({type(error).__name__}: {error})"
