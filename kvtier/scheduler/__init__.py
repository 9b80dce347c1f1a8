"""The scheduler half: where chunks live in each tier, what to evict, what changed."""

from __future__ import annotations

from kvtier.scheduler.base import (
    EventKind,
    Key,
    LoadPlan,
    LookupResult,
    StorePlan,
    TierEvent,
)
from kvtier.scheduler.manager import ChunkManager
from kvtier.scheduler.policies import make_policy

__all__ = [
    "ChunkManager",
    "EventKind",
    "Key",
    "LoadPlan",
    "LookupResult",
    "StorePlan",
    "TierEvent",
    "make_policy",
]
