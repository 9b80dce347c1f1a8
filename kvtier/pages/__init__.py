"""Moving engine pages to and from host memory: one planner and one mover for every path that
does (host-tier stores and loads, tier loads through a staging record, the peer's rows)."""

from kvtier.pages.mover import PageMover
from kvtier.pages.plan import Pages
from kvtier.pages.spaces import Spaces

__all__ = ["PageMover", "Pages", "Spaces"]
