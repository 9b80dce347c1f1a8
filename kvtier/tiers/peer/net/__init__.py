"""Prefill -> decode KV transfer over TCP: a library with no vLLM import.

One ``TransferServer`` per prefill worker rank, one ``TransferClient`` per decode worker rank;
decode rank i pulls from prefill rank i.

    TransferServer(rows, identity, secret)   prefill side: offer, take_done, withdraw; serves
    TransferClient(rows, identity, secret)   decode side: pull(host, port, req_id, remote, local)
    PeerIdentity                             what must match between the two ranks
    BlockRows, CpuBlockRows, CudaBlockRows   one rank's engine memory as (view, block) byte rows
    request_rows(groups, block_ids)          the row order both ends use
    TransferError                            every failure of a pull

Why pull, not push: the decode side knows its destination blocks and when it is ready to receive
(they are allocated by its scheduler, and only then can bytes land), so it asks; the prefill side
only has to keep its blocks and serve reads, with no knowledge of the decode engine's memory. A
decode that never comes costs the prefill side only a timeout: its offer expires at its deadline
and ``take_done`` hands the blocks back to the engine. The prefill engine frees an offer's blocks
only once ``take_done`` reports it, which happens only after no connection is still reading them.

Every connection is authenticated both ways with an HMAC challenge-response over a shared secret
and refused when the two ranks' identities differ (``auth.py``); frames are a fixed binary header
and bounded msgpack or raw row bytes, never pickles (``wire.py``); data carries an xxh3_64 checksum,
checked at the end of each part: a mismatch fails the pull (its blocks are computed again). Rows
move a slice at a time (``base.slices``), the device's work on one beside the socket's on the next.
"""

from __future__ import annotations

from kvtier.tiers.peer.net.base import BlockRows, PeerIdentity, TransferError, request_rows
from kvtier.tiers.peer.net.client import TransferClient
from kvtier.tiers.peer.net.rows_cpu import CpuBlockRows
from kvtier.tiers.peer.net.rows_cuda import CudaBlockRows
from kvtier.tiers.peer.net.server import ServerCounters, TransferServer

__all__ = [
    "BlockRows",
    "CpuBlockRows",
    "CudaBlockRows",
    "PeerIdentity",
    "ServerCounters",
    "TransferClient",
    "TransferError",
    "TransferServer",
    "request_rows",
]
