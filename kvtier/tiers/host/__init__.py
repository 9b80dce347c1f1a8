"""The host-memory tier: a record per chunk in (pinned) host memory, the first tier below the
engine.

Not an entry of the chain: every engine has one, sized by ``cpu_bytes_to_use``, and the halves
build it themselves from this package:

    index.py         the scheduler half's index (``ChunkManager``), with policies/ (lru, arc),
                     admission.py (which chunks enter) and slots.py (free slots)
    buffers.py       a rank's memory (``HostTier``: one record per slot), committed when built
                     (commit.py) and, on a GPU, pinned as the engine serves (pinning.py, its
                     CUDA calls pin_driver.py), once the machine's memory is found to hold it
                     (room.py), on the GPU's NUMA node (numa.py)
    io/              the engine <-> host copies: handlers.py picks them for the engine's device
"""

from kvtier.tiers.base.spec import TierSpec

SPEC: TierSpec[None] = TierSpec(name="cpu", hit_source="HOST")

__all__ = ["SPEC"]
