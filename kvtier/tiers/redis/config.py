"""The Redis tier's config section (extra-config key ``redis``)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.config_parse import (
    as_bool,
    keys,
    mapping,
    non_empty_str,
    non_negative_float,
    optional,
    positive_float,
    positive_int,
    required,
)

LOOKUP_WAIT_S = 0.002  # a loopback or LAN round trip: a new request usually needs no second step
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class RedisConfig:
    """The Redis/Valkey tier (extra-config key ``redis``), shared by many engines.

    ``url``: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS) or
    ``unix:///path.sock``; a password absent from the URL is read from the environment variable
    ``password_env``. ``cluster``: a Redis Cluster, reached through ``url`` and the ``seeds``
    (more URLs of its nodes). ``prefix`` namespaces every key; ``ttl_s`` expires a chunk that
    long after it was written (None: Redis's ``maxmemory-policy`` decides). ``timeout_s`` bounds
    every call: one that times out is a miss, never an error, and stops calls for a while.
    ``lookup_wait_s``: the longest a request's first lookup holds the engine's step for Redis's
    answer (0: never; a lookup not answered by then is asked again on a later step).
    ``connections``: per worker rank, for loads. ``max_queued_chunks``: chunks being written at
    once; more wait their turn in host memory (``scheduler/tier_writes.py``). ``required``: a
    Redis that cannot be reached, or refuses the credentials, at start-up is an error; false: a
    warning, and the tier is off.
    ``tls_ca``: the CA file a ``rediss://`` server's certificate is checked against (None: the
    system's).
    """

    url: str
    timeout_s: float = 1.0
    lookup_wait_s: float = LOOKUP_WAIT_S
    prefix: str = "kvtier"
    ttl_s: float | None = None
    cluster: bool = False
    seeds: tuple[str, ...] = ()
    connections: int = 2
    max_queued_chunks: int = 256
    password_env: str = "KVTIER_REDIS_PASSWORD"
    required: bool = True
    tls_ca: str | None = None

    def __post_init__(self) -> None:
        redis_url(self.url, "redis.url")
        positive_float(self.timeout_s, "redis.timeout_s")
        non_negative_float(self.lookup_wait_s, "redis.lookup_wait_s")
        non_empty_str(self.prefix, "redis.prefix")
        if self.ttl_s is not None:
            positive_float(self.ttl_s, "redis.ttl_s")
        as_bool(self.cluster, "redis.cluster")
        for seed in self.seeds:
            redis_url(seed, "redis.seeds")
        if self.seeds and not self.cluster:
            raise ValueError("kvtier: 'redis.seeds' name nodes of a Redis Cluster: set "
                             "'redis.cluster' to true, or remove them")  # fmt: skip
        if self.cluster and self.url.startswith("unix://"):
            raise ValueError("kvtier: 'redis.url' of a Redis Cluster must be redis:// or "
                             f"rediss://, got {self.url!r}")  # fmt: skip
        positive_int(self.connections, "redis.connections")
        positive_int(self.max_queued_chunks, "redis.max_queued_chunks")
        non_empty_str(self.password_env, "redis.password_env")
        as_bool(self.required, "redis.required")
        if self.tls_ca is not None:
            non_empty_str(self.tls_ca, "redis.tls_ca")

    @property
    def urls(self) -> tuple[str, ...]:
        """``url`` then the ``seeds``."""
        return (self.url, *self.seeds)

    @classmethod
    def from_mapping(cls, raw: object, key: str = "redis") -> RedisConfig:
        """Parse the ``redis`` mapping; ``url`` is required."""
        raw = mapping(raw, key, keys(cls))
        return cls(
            url=required(raw, key, "url", redis_url),
            timeout_s=optional(raw, key, "timeout_s", positive_float, 1.0),
            lookup_wait_s=optional(raw, key, "lookup_wait_s", non_negative_float, LOOKUP_WAIT_S),
            prefix=optional(raw, key, "prefix", non_empty_str, "kvtier"),
            ttl_s=optional(raw, key, "ttl_s", positive_float, None),
            cluster=optional(raw, key, "cluster", as_bool, False),
            seeds=optional(raw, key, "seeds", redis_urls, ()),
            connections=optional(raw, key, "connections", positive_int, 2),
            max_queued_chunks=optional(raw, key, "max_queued_chunks", positive_int, 256),
            password_env=optional(raw, key, "password_env", non_empty_str, "KVTIER_REDIS_PASSWORD"),
            required=optional(raw, key, "required", as_bool, True),
            tls_ca=optional(raw, key, "tls_ca", non_empty_str, None),
        )


def redis_url(value: object, key: str) -> str:
    url = non_empty_str(value, key)
    if not url.startswith(REDIS_SCHEMES):
        raise ValueError(
            f"kvtier: {key!r} must start with {', '.join(REDIS_SCHEMES)}; got {value!r}"
        )
    return url


def redis_urls(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(f"kvtier: {key!r} must be a list of Redis URLs, got {value!r}")
    return tuple(redis_url(url, key) for url in value)
