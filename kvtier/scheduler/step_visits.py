"""Which running requests a step must look at, and which of them may store: most need no look.

    StepVisits(requests, jobs, windows, block_tokens, chunk_tokens)
    .visit(step, slack, computed) -> Visited   the requests looked at, the store jobs reading
                                               blocks handed to them, the slack after the step
    .due(state) -> int                         the tokens at which its next chunk (or its tail)
                                               can be stored

A request is looked at when it was handed blocks (new ones, or a whole table) or computed as many
tokens as its ``RequestState.due``; ``StepRequests.due`` finds them in a few passes in C over
vLLM's columns. After a step every running request is at least ``slack`` tokens from its due,
so a decode step with no new block and fewer tokens than that is skipped whole
(``StepRequests.quiet``). A step bounds only the requests in it: while a running request sits
steps out (vLLM's token budget ran out before it, pipeline stages take turns), every step is
looked at. A sliding-window group frees blocks in place, unannounced: with one, every request is
looked at every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvtier.scheduler.job_table import JobTable
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.scheduled import NEVER, StepRequests, take_blocks


class Visited(NamedTuple):
    flush: set[int]  # store jobs still reading blocks the engine writes this step
    tracked: list[tuple[RequestState, int]]  # (state, tokens computed after the step): due
    slack: int  # how far every running request not tracked is from its due


class StepVisits:
    def __init__(
        self,
        requests: dict[str, RequestState],
        jobs: JobTable,
        windows: Sequence[int | None],
        block_tokens: int,
        chunk_tokens: int,
    ) -> None:
        self.requests, self.jobs = requests, jobs
        self.windows, self.block_tokens, self.chunk_tokens = (
            list(windows),
            block_tokens,
            chunk_tokens,
        )
        self._running: set[str] = set()  # requests seen in a step, not yet known to have left

    def visit(self, step: StepRequests, slack: int, computed: int) -> Visited:
        """``slack``, ``computed``: what the last step left (``computed``: at most the tokens a
        running request had computed by then)."""
        flush: set[int] = set()
        visit: Sequence[int] = ()
        after = NEVER  # after this step: how far every running request is from its due
        if any(w is not None for w in self.windows):
            visit, after = range(len(step)), 0
        elif step.quiet(slack, computed):  # most decode steps: nothing to look at
            after = slack - max(step.num_new_tokens.values(), default=0)
        else:
            visit, after = step.due(self.requests)
            if self._sat_out(step):  # its tokens are not seen: look at every step until it is
                after = 0
        tracked: list[tuple[RequestState, int]] = []
        for i in visit:
            request = step.request(i)
            state = self.requests.get(request.req_id)
            for ids in take_blocks(state, request, self.windows, self.block_tokens):
                if ids:
                    flush.update(self.jobs.reading(ids))
            if state is None:
                continue
            state.table_set = False
            done = request.num_computed_tokens
            if done >= self.due(state):
                tracked.append((state, done))
            else:
                state.due = self.due(state)
                after = min(after, state.due - done)
        return Visited(flush, tracked, after)

    def _sat_out(self, step: StepRequests) -> bool:
        """Whether a running request kvtier may store for sat this step out (vLLM's token budget
        ran out before it; pipeline stages take turns): ``step.due`` bounds only those in it.
        Requests seen leave once finished, preempted (no blocks) or untracked."""
        running = self._running
        running.update(step.req_ids)
        if len(running) == len(step):
            return False
        for req_id in running.difference(step.req_ids):
            state = self.requests.get(req_id)
            if state is None or state.finished or not any(state.block_ids):
                running.discard(req_id)
        return len(running) > len(step)

    def due(self, state: RequestState) -> int:
        due = (min(state.stored_upto) + 1) * self.chunk_tokens
        if state.tail_key is not None and not state.tail_done:
            due = min(due, state.tail_end)
        return due
