"""The host-memory tier: pinned buffers of chunks, the first tier below the engine.

Not an entry of the chain: every engine has it, sized by ``cpu_bytes_to_use``. Its buffers are
``buffers.py``, committed to memory when built (``commit.py``); the scheduler half's index is
``scheduler/manager.py``, its copies ``worker/copy_*.py``.
"""

from kvtier.tiers.base.spec import TierSpec

SPEC: TierSpec[None] = TierSpec(name="cpu", hit_source="HOST")

__all__ = ["SPEC"]
