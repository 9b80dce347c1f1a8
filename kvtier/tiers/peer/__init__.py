"""The peer tier: a prefill engine's KV pulled by its decode engine (prefill→decode).

    config.py    its section, ``transfer``     messages.py  a pull's source, an offer
    roles.py     who pulls what (the scheduler half: producer, consumer)
    planner.py   the scheduler half's pulls, offers and releases
    worker.py    a rank's listener (prefill) or puller (decode)
    build.py     both halves, from the config and the engine's role
    net/         the TCP library both ends speak (framed, checksummed, authenticated)

Not an entry of the chain: its loads are planned per request from the prefill engine's params.
"""

from kvtier.tiers.base.spec import TierSpec
from kvtier.tiers.peer.build import request_source, worker_tier
from kvtier.tiers.peer.config import TransferConfig
from kvtier.tiers.peer.messages import NAME

SPEC = TierSpec(
    name=NAME,
    hit_source="P2P",  # a prefill engine's KV
    section="transfer",
    parse=TransferConfig.from_mapping,
    default=TransferConfig(),
    source=request_source,
    worker=worker_tier,
)

__all__ = ["SPEC", "TransferConfig"]
