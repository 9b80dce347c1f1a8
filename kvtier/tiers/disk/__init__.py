"""The local-disk tier: a verified file per chunk and rank, persistent across restarts.

config.py   its section, ``disk``           index.py   the scheduler half's index
files.py    one rank's chunk files          names.py   file names, the directory scan
build.py    both halves from the config     (loads and writes: ``tiers/chunk_io.py``)
"""

from kvtier.tiers.base.spec import TierSpec
from kvtier.tiers.disk.build import NAME, scheduler_index, worker_tier
from kvtier.tiers.disk.config import DiskConfig

SPEC = TierSpec(
    name=NAME,
    hit_source="DISK",
    section="disk",
    parse=DiskConfig.from_mapping,
    scheduler=scheduler_index,
    worker=worker_tier,
    doc='{"path": str, "bytes": size, "write_through": bool = False}',
)

__all__ = ["SPEC", "DiskConfig"]
