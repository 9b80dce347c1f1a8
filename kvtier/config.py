"""kvtier's configuration: vLLM's ``kv_connector_extra_config`` parsed once into frozen dataclasses.

Extra-config keys (names follow vLLM's native offloading where it has them)::

    key                default     meaning
    cpu_bytes_to_use   (required)  host budget of the whole engine (all ranks): int bytes or "4GiB"
    block_size         None        tokens per chunk, a multiple of the engine block size
    eviction_policy    "lru"       lru | arc
    store_threshold    1           store a chunk once it was looked up this many times
    min_async_load_tokens 256      an asynchronous load (from disk) must add at least this many
                                   tokens, else the engine computes them: it costs a step
    hash_algo          "xxh3_128"  sha256 | xxh3_128
    shutdown_flush_s   4.0         the longest an engine's shutdown spends writing the host
                                   tier's chunks the disk or Redis tier lacks (0: none); vLLM
                                   gives worker processes VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS
                                   (5) to exit before it terminates them: raise both together
    disk               None        {"path": str, "bytes": size, "write_through": bool = False}
    redis              None        {"url": "redis://..." (or rediss://, unix://), "timeout_s": 1.0,
                                   "prefix", "ttl_s", "cluster", "seeds", ...}: ``RedisConfig``
    transfer           None        prefill→decode (kv_role kv_producer / kv_consumer): see
                                   ``TransferConfig``; its ``secret`` (or the environment
                                   variable KVTIER_TRANSFER_SECRET) is required for those roles

An optional key set to ``None`` counts as absent. Every error is a ``ValueError`` starting with
``kvtier: `` that names the key (dotted for nested keys: ``disk.bytes``) and what is accepted.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, TypeVar

from kvtier.sizes import ACCEPTED_SIZE_FORMS, parse_size

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["DiskConfig", "KVTierConfig", "RedisConfig", "TransferConfig", "parse_size"]

T = TypeVar("T")
Parser = Callable[[object, str], T]

EVICTION_POLICIES = ("lru", "arc")
HASH_ALGOS = ("sha256", "xxh3_128")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
LOAD_FAILURE_POLICIES = ("recompute", "fail")
SECRET_ENV = "KVTIER_TRANSFER_SECRET"
MIN_SECRET_BYTES = 16  # the transfer engine's HMAC key (kvtier.transfer.auth checks it too)


@dataclass(frozen=True)
class DiskConfig:
    """The local-disk tier (extra-config key ``disk``).

    ``bytes`` is the disk budget. ``write_through`` stores every chunk on disk when it is stored
    in CPU memory; otherwise (write-back) a chunk reaches disk when evicted from CPU memory.
    """

    path: str
    bytes: int
    write_through: bool = False

    def __post_init__(self) -> None:
        _non_empty_str(self.path, "disk.path")
        _positive_int(self.bytes, "disk.bytes")
        _bool(self.write_through, "disk.write_through")

    @classmethod
    def from_mapping(cls, raw: object, key: str = "disk") -> DiskConfig:
        """Parse the ``disk`` mapping; ``path`` and ``bytes`` are required."""
        raw = _mapping(raw, key, _keys(cls))
        return cls(
            path=_required(raw, key, "path", _non_empty_str),
            bytes=_required(raw, key, "bytes", _positive_size),
            write_through=_optional(raw, key, "write_through", _bool, False),
        )


@dataclass(frozen=True)
class RedisConfig:
    """The Redis/Valkey tier (extra-config key ``redis``), shared by many engines.

    ``url``: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS) or
    ``unix:///path.sock``; a password absent from the URL is read from the environment variable
    ``password_env``. ``cluster``: a Redis Cluster, reached through ``url`` and the ``seeds``
    (more URLs of its nodes). ``prefix`` namespaces every key; ``ttl_s`` expires a chunk that
    long after it was written (None: Redis's ``maxmemory-policy`` decides). ``timeout_s`` bounds
    every call: one that times out is a miss, never an error, and stops calls for a while.
    ``connections``: per worker rank, for loads. ``max_queued_chunks``: chunks being written at
    once; more wait their turn in host memory (``scheduler/tier_writes.py``). ``required``: a
    Redis that cannot be reached, or refuses the credentials, at start-up is an error; false: a
    warning, and the tier is off.
    ``tls_ca``: the CA file a ``rediss://`` server's certificate is checked against (None: the
    system's).
    """

    url: str
    timeout_s: float = 1.0
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
        _redis_url(self.url, "redis.url")
        _positive_float(self.timeout_s, "redis.timeout_s")
        _non_empty_str(self.prefix, "redis.prefix")
        if self.ttl_s is not None:
            _positive_float(self.ttl_s, "redis.ttl_s")
        _bool(self.cluster, "redis.cluster")
        for seed in self.seeds:
            _redis_url(seed, "redis.seeds")
        if self.seeds and not self.cluster:
            raise ValueError("kvtier: 'redis.seeds' name nodes of a Redis Cluster: set "
                             "'redis.cluster' to true, or remove them")  # fmt: skip
        if self.cluster and self.url.startswith("unix://"):
            raise ValueError("kvtier: 'redis.url' of a Redis Cluster must be redis:// or "
                             f"rediss://, got {self.url!r}")  # fmt: skip
        _positive_int(self.connections, "redis.connections")
        _positive_int(self.max_queued_chunks, "redis.max_queued_chunks")
        _non_empty_str(self.password_env, "redis.password_env")
        _bool(self.required, "redis.required")
        if self.tls_ca is not None:
            _non_empty_str(self.tls_ca, "redis.tls_ca")

    @property
    def urls(self) -> tuple[str, ...]:
        """``url`` then the ``seeds``."""
        return (self.url, *self.seeds)

    @classmethod
    def from_mapping(cls, raw: object, key: str = "redis") -> RedisConfig:
        """Parse the ``redis`` mapping; ``url`` is required."""
        raw = _mapping(raw, key, _keys(cls))
        return cls(
            url=_required(raw, key, "url", _redis_url),
            timeout_s=_optional(raw, key, "timeout_s", _positive_float, 1.0),
            prefix=_optional(raw, key, "prefix", _non_empty_str, "kvtier"),
            ttl_s=_optional(raw, key, "ttl_s", _positive_float, None),
            cluster=_optional(raw, key, "cluster", _bool, False),
            seeds=_optional(raw, key, "seeds", _redis_urls, ()),
            connections=_optional(raw, key, "connections", _positive_int, 2),
            max_queued_chunks=_optional(raw, key, "max_queued_chunks", _positive_int, 256),
            password_env=_optional(
                raw, key, "password_env", _non_empty_str, "KVTIER_REDIS_PASSWORD"
            ),
            required=_optional(raw, key, "required", _bool, True),
            tls_ca=_optional(raw, key, "tls_ca", _non_empty_str, None),
        )


@dataclass(frozen=True)
class TransferConfig:
    """Prefill→decode over TCP (extra-config key ``transfer``), for kv_producer/kv_consumer.

    A prefill engine's worker rank i listens on ``host``:``port`` + i (``port`` 0: an ephemeral
    port each) and is reached at ``advertise_host`` (default ``host``); a decode engine's rank i
    pulls from it. ``secret`` authenticates every connection (HMAC challenge-response); absent,
    it is read from the environment variable KVTIER_TRANSFER_SECRET. ``timeout_s`` bounds every
    pull's socket operations; ``hold_s`` is how long a prefill engine keeps a finished request's
    blocks for a decode engine that has not pulled them. ``connections`` per rank pair.
    ``load_failure_policy``: a failed pull is recomputed (``recompute``) or fails the request
    (``fail``), vLLM's ``kv_load_failure_policy``.
    """

    secret: str | None = None
    host: str = "127.0.0.1"
    advertise_host: str | None = None
    port: int = 0
    timeout_s: float = 10.0
    hold_s: float = 60.0
    connections: int = 2
    load_failure_policy: str = "recompute"

    def __post_init__(self) -> None:
        if self.secret is not None:
            _non_empty_str(self.secret, "transfer.secret")
        _non_empty_str(self.host, "transfer.host")
        if self.advertise_host is not None:
            _non_empty_str(self.advertise_host, "transfer.advertise_host")
        _port(self.port, "transfer.port")
        _positive_float(self.timeout_s, "transfer.timeout_s")
        _positive_float(self.hold_s, "transfer.hold_s")
        _positive_int(self.connections, "transfer.connections")
        _choice(LOAD_FAILURE_POLICIES)(self.load_failure_policy, "transfer.load_failure_policy")

    @classmethod
    def from_mapping(cls, raw: object, key: str = "transfer") -> TransferConfig:
        raw = _mapping(raw, key, _keys(cls))
        return cls(
            secret=_optional(raw, key, "secret", _non_empty_str, None),
            host=_optional(raw, key, "host", _non_empty_str, "127.0.0.1"),
            advertise_host=_optional(raw, key, "advertise_host", _non_empty_str, None),
            port=_optional(raw, key, "port", _port, 0),
            timeout_s=_optional(raw, key, "timeout_s", _positive_float, 10.0),
            hold_s=_optional(raw, key, "hold_s", _positive_float, 60.0),
            connections=_optional(raw, key, "connections", _positive_int, 2),
            load_failure_policy=_optional(
                raw, key, "load_failure_policy", _choice(LOAD_FAILURE_POLICIES), "recompute"
            ),
        )

    def secret_bytes(self) -> bytes:
        """The shared secret: the config's, else KVTIER_TRANSFER_SECRET; ValueError if neither."""
        secret = self.secret or os.environ.get(SECRET_ENV)
        if not secret:
            raise ValueError(
                f"kvtier: 'transfer.secret' (or the environment variable {SECRET_ENV}) is "
                "required for kv_role kv_producer and kv_consumer: the prefill and decode "
                "engines must share it"
            )
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"kvtier: 'transfer.secret' (or {SECRET_ENV}) must be at least "
                f"{MIN_SECRET_BYTES} bytes, got {len(secret.encode())}"
            )
        return secret.encode()

    @property
    def reach_host(self) -> str:
        return self.advertise_host or self.host


@dataclass(frozen=True)
class KVTierConfig:
    """Everything kvtier reads from ``kv_connector_extra_config``, validated at construction.

    ``block_size`` is tokens per chunk; ``None`` means one engine block per chunk. The engine
    block size is not part of the config: ``block_size_factor(engine_block_size)`` checks the
    multiple and gives the number of engine blocks per chunk (``from_extra_config`` checks it
    once up front, so a parsed config never fails there for the same engine block size).
    """

    cpu_bytes_to_use: int
    block_size: int | None = None
    eviction_policy: str = "lru"
    store_threshold: int = 1
    min_async_load_tokens: int = 256
    hash_algo: str = "xxh3_128"
    shutdown_flush_s: float = 4.0
    disk: DiskConfig | None = None
    redis: RedisConfig | None = None
    transfer: TransferConfig = field(default_factory=lambda: TransferConfig())

    def __post_init__(self) -> None:
        _positive_int(self.cpu_bytes_to_use, "cpu_bytes_to_use")
        if self.block_size is not None:
            _positive_int(self.block_size, "block_size")
        _choice(EVICTION_POLICIES)(self.eviction_policy, "eviction_policy")
        _positive_int(self.store_threshold, "store_threshold")
        _positive_int(self.min_async_load_tokens, "min_async_load_tokens")
        _choice(HASH_ALGOS)(self.hash_algo, "hash_algo")
        _non_negative_float(self.shutdown_flush_s, "shutdown_flush_s")

    @classmethod
    def from_extra_config(
        cls, extra: Mapping[str, object] | None, engine_block_size: int
    ) -> KVTierConfig:
        """Parse vLLM's ``kv_connector_extra_config`` (``None`` counts as ``{}``).

        Raises ``ValueError`` naming the key on an unknown key, a missing ``cpu_bytes_to_use``,
        a wrong type, a value out of range, or a ``block_size`` that is not a multiple of
        ``engine_block_size``.
        """
        raw = _mapping({} if extra is None else extra, "", _keys(cls))
        if raw.get("cpu_bytes_to_use") is None:
            raise ValueError(
                "kvtier: 'cpu_bytes_to_use' is required: the host-memory budget of the whole "
                f"engine (all ranks), {ACCEPTED_SIZE_FORMS}"
            )
        config = cls(
            cpu_bytes_to_use=_required(raw, "", "cpu_bytes_to_use", _positive_size),
            block_size=_optional(raw, "", "block_size", _positive_int, None),
            eviction_policy=_optional(
                raw, "", "eviction_policy", _choice(EVICTION_POLICIES), "lru"
            ),
            store_threshold=_optional(raw, "", "store_threshold", _positive_int, 1),
            min_async_load_tokens=_optional(raw, "", "min_async_load_tokens", _positive_int, 256),
            hash_algo=_optional(raw, "", "hash_algo", _choice(HASH_ALGOS), "xxh3_128"),
            shutdown_flush_s=_optional(raw, "", "shutdown_flush_s", _non_negative_float, 4.0),
            disk=_optional(raw, "", "disk", DiskConfig.from_mapping, None),
            redis=_optional(raw, "", "redis", RedisConfig.from_mapping, None),
            transfer=_optional(raw, "", "transfer", TransferConfig.from_mapping, TransferConfig()),
        )
        config.block_size_factor(engine_block_size)
        return config

    def block_size_factor(self, engine_block_size: int) -> int:
        """Engine blocks per chunk: ``block_size // engine_block_size``, or 1 without a block_size.

        Raises ``ValueError`` when ``block_size`` is not a positive multiple of
        ``engine_block_size``.
        """
        _positive_int(engine_block_size, "engine block size")
        if self.block_size is None:
            return 1
        if self.block_size % engine_block_size != 0:
            raise ValueError(
                "kvtier: 'block_size' must be a positive multiple of the engine block size "
                f"{engine_block_size}, got {self.block_size}"
            )
        return self.block_size // engine_block_size


# --- one parser per type: (value, dotted key) -> typed value, or ValueError naming the key ---


def _positive_int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"kvtier: {key!r} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"kvtier: {key!r} must be a positive integer, got {value}")
    return value


def _positive_size(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"kvtier: {key!r} must be {ACCEPTED_SIZE_FORMS}, got {value!r}")
    size = parse_size(value, key)
    if size == 0:
        raise ValueError(f"kvtier: {key!r} must be more than 0 bytes, got {value!r}")
    return size


def _positive_float(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"kvtier: {key!r} must be a positive number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"kvtier: {key!r} must be a positive number, got {value!r}")
    return float(value)


def _non_negative_float(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"kvtier: {key!r} must be a number >= 0, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"kvtier: {key!r} must be a number >= 0, got {value!r}")
    return float(value)


def _port(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
        raise ValueError(f"kvtier: {key!r} must be a port 0..65535 (0: ephemeral), got {value!r}")
    return value


def _bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"kvtier: {key!r} must be true or false, got {value!r}")
    return value


def _non_empty_str(value: object, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"kvtier: {key!r} must be a non-empty string, got {value!r}")
    return value


def _choice(choices: tuple[str, ...]) -> Parser[str]:
    def parse(value: object, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"kvtier: {key!r} must be one of {', '.join(choices)}; got {value!r}")
        return value

    return parse


def _redis_url(value: object, key: str) -> str:
    url = _non_empty_str(value, key)
    if not url.startswith(REDIS_SCHEMES):
        raise ValueError(
            f"kvtier: {key!r} must start with {', '.join(REDIS_SCHEMES)}; got {value!r}"
        )
    return url


def _redis_urls(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(f"kvtier: {key!r} must be a list of Redis URLs, got {value!r}")
    return tuple(_redis_url(url, key) for url in value)


# --- mappings: accepted keys, required and optional values; key "" is the top level ---


def _keys(cls: type[DataclassInstance]) -> tuple[str, ...]:
    """Accepted keys of a config dataclass: its field names."""
    return tuple(f.name for f in fields(cls))


def _dotted(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _mapping(raw: object, key: str, accepted: tuple[str, ...]) -> Mapping[str, object]:
    """``raw`` as a mapping whose keys are all in ``accepted``."""
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"kvtier: {key or 'kv_connector_extra_config'!r} must be a mapping with keys "
            f"{', '.join(accepted)}; got {raw!r}"
        )
    for name in raw:
        if name not in accepted:
            close = difflib.get_close_matches(str(name), accepted, n=1)
            hint = f"; did you mean {_dotted(key, close[0])!r}?" if close else ""
            raise ValueError(
                f"kvtier: unknown key {_dotted(key, str(name))!r}{hint} "
                f"(accepted keys: {', '.join(_dotted(key, a) for a in accepted)})"
            )
    return raw


def _required(raw: Mapping[str, object], key: str, name: str, parse: Parser[T]) -> T:
    """``parse`` of ``raw[name]``; absent or ``None`` is an error."""
    value = raw.get(name)
    if value is None:
        raise ValueError(f"kvtier: {_dotted(key, name)!r} is required")
    return parse(value, _dotted(key, name))


def _optional(raw: Mapping[str, object], key: str, name: str, parse: Parser[T], default: T) -> T:
    """``parse`` of ``raw[name]``, or ``default`` when it is absent or ``None``."""
    value = raw.get(name)
    return default if value is None else parse(value, _dotted(key, name))
