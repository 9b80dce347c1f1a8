"""The peer tier's config section (extra-config key ``transfer``): prefill→decode over TCP."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvtier.config_parse import (
    choice,
    keys,
    mapping,
    non_empty_str,
    optional,
    port,
    positive_float,
    positive_int,
)

LOAD_FAILURE_POLICIES = ("recompute", "fail")
SECRET_ENV = "KVTIER_TRANSFER_SECRET"
MIN_SECRET_BYTES = 16  # the transfer engine's HMAC key (kvtier.tiers.peer.net.auth checks it too)


@dataclass(frozen=True)
class TransferConfig:
    """Prefill→decode over TCP (extra-config key ``transfer``), for kv_producer/kv_consumer.

    A prefill engine's worker rank i listens on ``host``:``port`` + i (``port`` 0: an ephemeral
    port each; of a server's data-parallel engines, engine d's rank i on ``port`` + d × its
    ranks + i) and is reached at ``advertise_host`` (default ``host``); a decode engine's rank i
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
            non_empty_str(self.secret, "transfer.secret")
        non_empty_str(self.host, "transfer.host")
        if self.advertise_host is not None:
            non_empty_str(self.advertise_host, "transfer.advertise_host")
        port(self.port, "transfer.port")
        positive_float(self.timeout_s, "transfer.timeout_s")
        positive_float(self.hold_s, "transfer.hold_s")
        positive_int(self.connections, "transfer.connections")
        choice(LOAD_FAILURE_POLICIES)(self.load_failure_policy, "transfer.load_failure_policy")

    @classmethod
    def from_mapping(cls, raw: object, key: str = "transfer") -> TransferConfig:
        raw = mapping(raw, key, keys(cls))
        return cls(
            secret=optional(raw, key, "secret", non_empty_str, None),
            host=optional(raw, key, "host", non_empty_str, "127.0.0.1"),
            advertise_host=optional(raw, key, "advertise_host", non_empty_str, None),
            port=optional(raw, key, "port", port, 0),
            timeout_s=optional(raw, key, "timeout_s", positive_float, 10.0),
            hold_s=optional(raw, key, "hold_s", positive_float, 60.0),
            connections=optional(raw, key, "connections", positive_int, 2),
            load_failure_policy=optional(
                raw, key, "load_failure_policy", choice(LOAD_FAILURE_POLICIES), "recompute"
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
