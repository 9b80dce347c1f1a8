"""Each thread's connections to the Redis nodes, dropped everywhere after a failure.

ThreadConnections(config)
.get(address, lane)        this thread's connection to ``address`` on ``lane`` (opened when
                           needed; a thread never shares one)
.fail()                    a failure somewhere: every thread drops its connections before
                           its next call; this thread's are closed now
.touch()                   drop this thread's connections if a failure happened since
.tls_for(address, check)   the TLS context of a ``rediss://`` address
.close()                   close every thread's connections (later calls open new ones)
"""

from __future__ import annotations

import ssl
import threading

from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.conn import Connection
from kvtier.tiers.redis.url import RedisAddress


class ThreadConnections:
    def __init__(self, config: RedisConfig) -> None:
        self.config = config
        self._tls: ssl.SSLContext | None = None  # made at the first TLS connection
        self._local = threading.local()
        self._lock = threading.Lock()
        self._generation = 0  # bumped by a failure: every thread drops its connections
        self._all: set[Connection] = set()

    def touch(self) -> dict[tuple[str, int, int], Connection]:
        """This thread's connections, by (host, port, lane); dropped after any failure."""
        local = self._local
        if getattr(local, "generation", None) != self._generation:
            self._drop()
            local.conns, local.generation = {}, self._generation
        conns: dict[tuple[str, int, int], Connection] = local.conns
        return conns

    def get(self, address: RedisAddress, lane: int) -> Connection:
        conns = self.touch()
        place = (*address.node, lane)
        conn = conns.get(place)
        if conn is None or conn.closed:
            conn = Connection(address, self.config.timeout_s, self.tls_for(address))
            conns[place] = conn
            with self._lock:
                self._all.add(conn)
        return conn

    def fail(self) -> None:
        with self._lock:
            self._generation += 1
        self._drop()

    def _drop(self) -> None:
        for conn in getattr(self._local, "conns", {}).values():
            conn.close()
            with self._lock:
                self._all.discard(conn)
        self._local.conns = {}

    def tls_for(self, address: RedisAddress, checking: bool = False) -> ssl.SSLContext | None:
        """The TLS context of ``rediss://`` addresses (the system's CAs, or ``tls_ca``)."""
        if not address.tls:
            return None
        if self._tls is None:
            try:
                self._tls = ssl.create_default_context(cafile=self.config.tls_ca)
            except (OSError, ssl.SSLError) as error:
                if not checking:
                    raise
                raise ValueError(f"kvtier: 'redis.tls_ca': cannot load {self.config.tls_ca!r} "
                                 f"as a CA file: {error}") from None  # fmt: skip
        return self._tls

    def close(self) -> None:
        with self._lock:
            self._generation += 1
            conns, self._all = self._all, set()
        for conn in conns:
            conn.close()
