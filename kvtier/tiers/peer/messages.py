"""What the peer tier's two halves say to each other: a pull's source, and a prefill's offer.

Both travel in the step plan: a pull as a load job's source (``PeerBlocks``), an offer and a
release as the peer tier's messages to its worker side (``StepPlan.messages["peer"]``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.addresses import TransferSpec

NAME = "peer"  # the tier's name: its medium, stats, log, /metrics label


@dataclass(frozen=True)
class PeerBlocks(TransferSpec):
    """A prefill engine's blocks of one finished request, pulled by the decode engine.

    ``endpoints[rank]`` is the (host, port) of the prefill rank that worker rank ``rank`` pulls
    from; ``block_ids[g]`` are the prefill engine's blocks of group ``g``, paired one to one with
    the destination's blocks of that group.
    """

    endpoints: tuple[tuple[str, int], ...]
    req_id: str
    block_ids: tuple[tuple[int, ...], ...]

    @property
    def medium(self) -> str:
        return NAME


@dataclass(frozen=True)
class PeerOffer:
    """A finished prefill request whose blocks (per group) a decode engine may pull for
    ``hold_s`` seconds from when the workers receive the offer (prefill→decode)."""

    req_id: str
    block_ids: tuple[tuple[int, ...], ...]
    hold_s: float
