"""The prefill side's offers: which blocks of which finished request a decode may pull, until when.

An offer ends exactly once: released by the client (``ok`` as the client reports it), withdrawn by
the engine, or expired (its deadline passed; checked on each ``take_done`` and each pull). It is
reported by ``take_done`` only once no connection is still reading its blocks: the engine frees
the blocks when it sees the report, so a block is never reused while it is being sent.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

REMEMBERED = 4096  # ended request ids kept to refuse a late pull at once, not after a wait


class Refused(Exception):
    """A pull the server must refuse; the message is the reason sent to the client."""


@dataclass
class Offer:
    req_id: str
    blocks: tuple[frozenset[int], ...]  # per group
    deadline: float  # time.monotonic()
    readers: int = 0  # connections sending its blocks now
    outcome: bool | None = None  # set when it ended while readers were still sending


class OfferTable:
    """Shared by the engine's thread (offer, withdraw, take_done) and connection threads."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open: dict[str, Offer] = {}
        self._ending: dict[str, Offer] = {}  # ended, waiting for their last reader
        self._ended: OrderedDict[str, str] = OrderedDict()  # req_id -> how it ended
        self._done: list[tuple[str, bool]] = []
        self._closed = False
        self.expired = 0

    def offer(self, req_id: str, block_ids: Sequence[Sequence[int]], deadline: float) -> None:
        blocks = tuple(frozenset(map(int, ids)) for ids in block_ids)
        with self._cond:
            if req_id in self._open or req_id in self._ending:
                raise ValueError(f"request {req_id!r} is already offered")
            self._ended.pop(req_id, None)
            self._open[req_id] = Offer(req_id, blocks, deadline)
            self._cond.notify_all()

    def claim(self, req_id: str, block_ids: Sequence[Sequence[int]], wait_s: float) -> Offer:
        """The open offer of ``req_id`` with one more reader, waiting up to ``wait_s`` for it to
        be offered; ``Refused`` when it is unknown, ended, expired or lacks a block asked for."""
        give_up = time.monotonic() + wait_s
        with self._cond:
            while (offer := self._open.get(req_id)) is None:
                if self._closed:
                    raise Refused("server closing")
                if req_id in self._ended:
                    raise Refused(f"request {req_id!r} {self._ended[req_id]}")
                left = give_up - time.monotonic()
                if left <= 0:
                    raise Refused(f"unknown request {req_id!r}")
                self._cond.wait(left)
            if time.monotonic() > offer.deadline:
                self._end(offer, False, "expired")
                raise Refused(f"request {req_id!r} expired")
            _check_blocks(offer, block_ids)
            offer.readers += 1
            return offer

    def unclaim(self, offer: Offer) -> None:
        with self._cond:
            offer.readers -= 1
            if offer.readers == 0 and self._ending.pop(offer.req_id, None) is not None:
                assert offer.outcome is not None
                self._done.append((offer.req_id, offer.outcome))
                self._cond.notify_all()

    def release(self, req_id: str, ok: bool) -> None:
        with self._cond:
            if (offer := self._open.get(req_id)) is not None:
                self._end(offer, ok, "released")

    def withdraw(self, req_id: str) -> None:
        with self._cond:
            if (offer := self._open.get(req_id)) is not None:
                self._end(offer, False, "withdrawn")

    def take_done(self) -> list[tuple[str, bool]]:
        now = time.monotonic()
        with self._cond:
            for offer in [o for o in self._open.values() if now > o.deadline]:
                self._end(offer, False, "expired")
            done, self._done = self._done, []
            return done

    def wait_done(self, timeout: float) -> None:
        """Block until an offer ended (``take_done`` has something), at most ``timeout``; an
        offer that merely passed its deadline ends at the next ``take_done``."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._done) or self._closed, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def check_integrity(self) -> None:
        with self._cond:
            assert not set(self._open) & set(self._ending), "an offer both open and ending"
            assert all(o.readers >= 0 for o in self._open.values()), "negative readers"
            assert all(o.readers > 0 for o in self._ending.values()), "ending without readers"

    def _end(self, offer: Offer, ok: bool, how: str) -> None:
        del self._open[offer.req_id]
        self._ended[offer.req_id] = how
        while len(self._ended) > REMEMBERED:
            self._ended.popitem(last=False)
        if how == "expired":
            self.expired += 1
        if offer.readers:
            offer.outcome = ok
            self._ending[offer.req_id] = offer
        else:
            self._done.append((offer.req_id, ok))
            self._cond.notify_all()


def _check_blocks(offer: Offer, block_ids: Sequence[Sequence[int]]) -> None:
    if len(block_ids) != len(offer.blocks):
        raise Refused(
            f"request {offer.req_id!r} has {len(offer.blocks)} groups, asked for {len(block_ids)}"
        )
    for g, (ids, offered) in enumerate(zip(block_ids, offer.blocks)):
        stray = sorted(set(ids) - offered)
        if stray:
            raise Refused(f"blocks not offered for request {offer.req_id!r}: group {g} {stray[:8]}")
