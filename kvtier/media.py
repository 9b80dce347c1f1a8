"""The two ends of a transfer: where bytes are read from and written to.

A medium is a name: the engine's KV cache, the host tier, or a tier of the chain (its
``TierSpec.name``: ``disk``, ``redis``, a tier from outside kvtier). The worker half registers a
handler per ``(src, dst)`` pair of names.
"""

from __future__ import annotations

from typing import Final


class Medium:
    """The media every engine has; a tier's medium is its name."""

    ENGINE: Final = "engine"  # the engine's own paged KV cache (GPU or CPU memory)
    CPU: Final = "cpu"  # kvtier's host-memory tier
