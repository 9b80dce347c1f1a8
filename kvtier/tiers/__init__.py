"""Where chunks live: one file per tier."""

from kvtier.tiers.host.buffers import HostTier

__all__ = ["HostTier"]
