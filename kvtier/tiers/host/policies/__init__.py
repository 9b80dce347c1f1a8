"""Eviction policies, by name: ``make_policy("lru" | "arc", capacity)``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from kvtier.tiers.host.policies.arc import ArcPolicy
from kvtier.tiers.host.policies.base import EvictionPolicy, KeyPredicate
from kvtier.tiers.host.policies.lru import LruPolicy

POLICIES: Final[Mapping[str, Callable[[int], EvictionPolicy]]] = MappingProxyType(
    {"lru": LruPolicy, "arc": ArcPolicy}
)


def make_policy(name: str, capacity: int) -> EvictionPolicy:
    """Build the policy called ``name`` for a tier of ``capacity`` chunks.

    Raises ValueError, listing the valid names, when ``name`` is unknown.
    """
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown eviction policy {name!r}; valid names: {sorted(POLICIES)}")
    return factory(capacity)


__all__ = ["POLICIES", "ArcPolicy", "EvictionPolicy", "KeyPredicate", "LruPolicy", "make_policy"]
