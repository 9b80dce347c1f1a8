"""The Redis/Valkey tier: chunks shared by many engines through one store (or a cluster).

config.py  its section, ``redis``      index.py   the scheduler half's index (lookups)
tier.py    one rank's records          io.py      its load and (pipelined) write handlers
store.py   the store: one server or a cluster (conn, cluster, breaker, errors, url, check)
record.py  a record's bytes            keys.py    a record's key        start.py  start-up
build.py   both halves from the config
"""

from kvtier.tiers.base.spec import TierSpec
from kvtier.tiers.redis.build import NAME, scheduler_index, worker_tier
from kvtier.tiers.redis.config import RedisConfig

SPEC = TierSpec(
    name=NAME,
    hit_source="EXTERNAL_UNSPECIFIED",  # a remote store: vLLM has no source for it
    section="redis",
    parse=RedisConfig.from_mapping,
    scheduler=scheduler_index,
    worker=worker_tier,
    doc='{"url": "redis://..." (or rediss://, unix://), "timeout_s": 1.0, "prefix", ...}',
)

__all__ = ["SPEC", "RedisConfig"]
