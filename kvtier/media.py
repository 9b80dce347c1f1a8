"""The two ends of a transfer: where bytes are read from and written to."""

from __future__ import annotations

from enum import Enum


class Medium(Enum):
    """One end of a transfer. Tiers add members; handlers are registered per (src, dst) pair."""

    ENGINE = "engine"  # the engine's own paged KV cache (GPU or CPU memory)
    CPU = "cpu"  # kvtier's host-memory tier
    DISK = "disk"
    REDIS = "redis"
    PEER = "peer"
