"""Where chunks live: one file per tier."""

from kvtier.tiers.cpu import HostTier

__all__ = ["HostTier"]
