"""What the engine runs each step, and how it updates the block tables the scheduler half keeps.

    ScheduledRequest                                 a request this step runs: its new blocks
    StepRequests                                     a step's requests, running ones as columns
    take_blocks(state, request, windows, tokens) -> the blocks newly handed to the request
    forget_blocks(state)                             a preempted request's blocks went back

A running request's table only grows: each step appends the blocks the engine allocated to it,
so a step costs what changed, never the request's length. The whole table comes again only when
the engine hands it over anew (a request scheduled for the first time or resumed after a
preemption). A sliding window frees blocks in place without saying so; a step's first token
tells which ones it may have freed, and those are never read (``RequestState.dropped``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import NamedTuple

import numpy as np

from kvtier.scheduler.request import RequestState


class ScheduledRequest(NamedTuple):
    """A request the engine runs this step.

    ``block_ids``: per group, the request's whole block table; with ``appended``, only the blocks
    the engine allocated to it this step (None: none), appended to the table kvtier holds.
    ``num_computed_tokens``: tokens computed once this step's ``num_new_tokens`` are. The step's
    first token (``num_computed_tokens - num_new_tokens``) bounds what a sliding window of an
    appended table may have dropped; the default 0 is the cautious answer (drops the most).
    """

    req_id: str
    block_ids: Sequence[Sequence[int]] | None
    num_computed_tokens: int
    num_new_tokens: int = 0
    appended: bool = False


@dataclass(frozen=True)
class StepRequests:
    """The requests one step runs, as columns (vLLM's own lists where it has them): request
    ``req_ids[i]`` got ``block_ids[i]`` (per group; None: none), had ``computed[i]`` tokens
    computed before the step, and computes ``num_new_tokens[req_ids[i]]``. The blocks are its
    whole table for the requests at ``whole`` (scheduled for the first time, or resumed), and
    the blocks appended to it this step for the others.

    Columns, because at high concurrency most running requests have nothing for kvtier to do in
    a step (a decode token, no new block, no chunk completed): ``due`` finds those that do in a
    few passes in C, instead of a Python step per request.
    """

    req_ids: Sequence[str] = ()
    block_ids: Sequence[Sequence[Sequence[int]] | None] = ()
    computed: Sequence[int] = ()
    num_new_tokens: Mapping[str, int] = field(default_factory=dict)
    whole: AbstractSet[int] = frozenset()

    @staticmethod
    def of(requests: Iterable[ScheduledRequest]) -> StepRequests:
        """``requests``, in their order, as a step."""
        requests = list(requests)
        return StepRequests(
            [r.req_id for r in requests],
            [r.block_ids for r in requests],
            [r.num_computed_tokens - r.num_new_tokens for r in requests],
            {r.req_id: r.num_new_tokens for r in requests},
            frozenset(i for i, r in enumerate(requests) if not r.appended),
        )

    def __len__(self) -> int:
        return len(self.req_ids)

    def __iter__(self) -> Iterator[ScheduledRequest]:
        return map(self.request, range(len(self.req_ids)))

    def request(self, i: int) -> ScheduledRequest:
        """Request ``i`` as a ``ScheduledRequest``."""
        req_id = self.req_ids[i]
        count = self.num_new_tokens[req_id]
        return ScheduledRequest(
            req_id, self.block_ids[i], self.computed[i] + count, count, i not in self.whole
        )

    def quiet(self, slack: int, computed: int) -> bool:
        """Whether no request can have anything for kvtier this step, when after the last one
        every running request was at least ``slack`` tokens from its ``RequestState.due`` and
        none had more than ``computed`` tokens computed: no table handed over, no new block,
        fewer tokens computed than ``slack``, and none computed unseen (never, in vLLM)."""
        tokens = self.num_new_tokens
        return (
            not self.whole
            and slack > (max(tokens.values()) if tokens else 0)
            and not any(map(is_not, self.block_ids, repeat(None)))
            and max(self.computed, default=0) <= computed
        )

    def computed_after(self) -> int:
        """At most how many tokens a request has computed after this step."""
        tokens = self.num_new_tokens
        return max(self.computed, default=0) + (max(tokens.values()) if tokens else 0)

    def due(self, states: Mapping[str, RequestState]) -> tuple[list[int], int]:
        """The requests kvtier must look at this step, by index, in order: blocks handed over
        (new or a whole table), or as many tokens computed after the step as their
        ``RequestState.due`` (a request kvtier does not track: blocks only); and how many tokens
        the others are at least from theirs (``NEVER``: none tracked)."""
        n = len(self.req_ids)
        if not n:
            return [], NEVER
        found = list(map(states.get, self.req_ids, repeat(_UNTRACKED)))
        gap = np.fromiter(map(_DUE, found), np.int64, n)
        gap -= np.fromiter(map(self.num_new_tokens.__getitem__, self.req_ids), np.int64, n)
        gap -= np.asarray(self.computed, dtype=np.int64)  # due - tokens computed after the step
        picked = gap <= 0
        picked[list(compress(range(n), map(is_not, self.block_ids, repeat(None))))] = True
        picked[list(self.whole)] = True
        others = gap[~picked]
        return np.flatnonzero(picked).tolist(), int(others.min()) if len(others) else NEVER


NEVER = int(np.iinfo(np.int64).max // 2)  # a ``due`` never reached (no chunk kvtier tracks)


class _Untracked:
    due = NEVER  # a request kvtier does not track has no chunk to store


_UNTRACKED = _Untracked()


_DUE = attrgetter("due")


def take_blocks(
    state: RequestState | None,
    request: ScheduledRequest,
    windows: Sequence[int | None],
    block_tokens: int,
) -> list[Sequence[int]]:
    """Bring ``state``'s table up to date with ``request``; per group, the blocks new to it.

    New: appended blocks, blocks of a whole table beyond those already seen (``planned``), and
    seen ones that changed; the engine may write them this step, so a store still reading one
    must finish first. O(new blocks) for an appended table. A request kvtier does not track
    (``state`` None) has no table: its new blocks are returned all the same.
    """
    if request.block_ids is None:
        new: Sequence[Sequence[int]] = [() for _ in windows]
    else:
        new = request.block_ids
    if state is None:
        return list(new)
    if not request.appended:
        return [_replace(state, g, ids) for g, ids in enumerate(new)]
    fresh: list[Sequence[int]] = []
    for g, ids in enumerate(new):
        table = state.block_ids[g]
        unseen = table[state.planned[g] :] if state.planned[g] < len(table) else ()
        table += ids
        state.planned[g] = len(table)
        fresh.append([*unseen, *ids] if unseen else ids)
    first_token = request.num_computed_tokens - request.num_new_tokens
    for g, window in enumerate(windows):
        if window is not None:  # blocks wholly before the step's window may be freed already
            dropped = max(0, first_token - window + 1) // block_tokens
            state.dropped[g] = max(state.dropped[g], dropped)
    return fresh


def _replace(state: RequestState, group: int, ids: Sequence[int]) -> list[int]:
    """The whole table of ``group`` replaces the one kvtier holds; the blocks new to it.

    The engine's table shows the blocks a sliding window dropped (its null block), so
    ``dropped`` starts over.
    """
    old, seen = state.block_ids[group], state.planned[group]
    table = list(ids)
    fresh = [block for block, was in zip(table, old[:seen]) if block != was]
    fresh += table[seen:]
    state.block_ids[group] = table
    state.planned[group] = len(table)
    state.dropped[group] = 0
    return fresh


def forget_blocks(state: RequestState) -> None:
    """``state``'s request was preempted: the engine took its blocks back; it starts over."""
    for g in range(state.num_groups):
        state.block_ids[g] = []
        state.planned[g] = 0
        state.dropped[g] = 0
