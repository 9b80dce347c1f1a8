"""A Redis URL as connection settings: ``redis://``, ``rediss://`` (TLS), ``unix://``.

    redis://[user[:password]@]host[:port][/db]
    rediss://[user[:password]@]host[:port][/db]
    unix://[user[:password]@]/path/to/redis.sock[?db=N]

A password absent from the URL is read from the environment variable ``password_env``. A
password is never shown: errors mask it, ``RedisAddress`` leaves it out of its repr, and a node
is named by ``describe`` (no credentials).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

DEFAULT_PORT = 6379


@dataclass(frozen=True)
class RedisAddress:
    host: str = ""  # empty for a unix socket
    port: int = DEFAULT_PORT
    path: str = ""  # a unix socket's path
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    db: int = 0

    @property
    def node(self) -> tuple[str, int]:
        """What tells one server from another: (host, port), or (socket path, 0)."""
        return (self.path, 0) if self.path else (self.host, self.port)

    def describe(self) -> str:
        """The address for a person: scheme, host, port, db; never credentials."""
        if self.path:
            return f"unix://{self.path}?db={self.db}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'rediss' if self.tls else 'redis'}://{host}:{self.port}/{self.db}"

    def at(self, host: str, port: int) -> RedisAddress:
        """Another node of the same Redis Cluster: same credentials and TLS, db 0."""
        return RedisAddress(host, port, "", self.tls, self.username, self.password, 0)


def parse_url(url: str, key: str = "redis.url", password_env: str = "") -> RedisAddress:
    """``url`` as settings; ValueError naming ``key`` and the bad part (never the password)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"kvtier: {key!r}: {error} in {masked(url)!r}") from None
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if password is None and password_env:
        password = os.environ.get(password_env) or None
    if parts.scheme == "unix":
        return _unix(parts, url, key, username, password)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"kvtier: {key!r} must start with redis://, rediss:// or unix://; "
                         f"got {masked(url)!r}")  # fmt: skip
    if not parts.hostname:
        raise ValueError(f"kvtier: {key!r} names no host: {masked(url)!r}")
    db = _db(parts.path.strip("/") or "0", url, key)
    tls = parts.scheme == "rediss"
    return RedisAddress(parts.hostname, port or DEFAULT_PORT, "", tls, username, password, db)


def _unix(
    parts: SplitResult, url: str, key: str, username: str | None, password: str | None
) -> RedisAddress:
    if not parts.path:
        raise ValueError(f"kvtier: {key!r} names no socket path (unix:///path/redis.sock): "
                         f"{masked(url)!r}")  # fmt: skip
    if parts.hostname:
        raise ValueError(f"kvtier: {key!r}: a unix socket URL has no host ({parts.hostname!r}); "
                         "write unix:///path/redis.sock")  # fmt: skip
    db = _db(parse_qs(parts.query).get("db", ["0"])[0], url, key)
    return RedisAddress(path=parts.path, username=username, password=password, db=db)


def _db(value: str, url: str, key: str) -> int:
    if not value.isdigit():
        raise ValueError(f"kvtier: {key!r}: the database must be a number, got {value!r} in "
                         f"{masked(url)!r}")  # fmt: skip
    return int(value)


def masked(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if not password:
        return url
    return url.replace(f":{password}@", ":***@", 1)
