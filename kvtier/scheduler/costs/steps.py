"""The engine's steps, timed from the scheduler half's calls: what computing tokens costs, and
what a step costs that computes none.

    StepTimer.started() / ended()                       a request kvtier tracks arrived / ended
    StepTimer.step(tokens, running, timed) -> Sample    a step is planned: the last one's period
    StepTimer.busy -> bool                              the last step computed for requests
                                                        that are still running

The scheduler half plans every step (``build_plan``), so the time from one plan to the next is a
step's period: its forward, its stores, and the engine's own work around it. It is a sample only
when the engine went straight from one step to the next, with no wait for work in between: some
request alive at the first plan was still alive at the second (an engine with a request left
never idles). A step whose forward waited for a load (a synchronous load) is not a sample; one
that computed no token (requests waiting for their loads) is a sample of 0 tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Sample(NamedTuple):
    """A step that computed ``tokens`` took ``seconds``."""

    tokens: int
    seconds: float


class _Open(NamedTuple):
    started: float
    tokens: int
    running: int  # requests it runs
    alive: int  # requests alive when it was planned
    finished: int  # requests finished by then (``StepTimer.finished``)
    timed: bool


class StepTimer:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.alive = 0  # requests tracked and not finished
        self.finished = 0  # requests finished so far
        self._open: _Open | None = None

    def started(self) -> None:
        self.alive += 1

    def ended(self) -> None:
        self.alive -= 1
        self.finished += 1

    def step(self, tokens: int, running: int, timed: bool) -> Sample | None:
        """A step computing ``tokens`` for ``running`` requests is planned now (``timed``: no
        load runs before its forward); the step planned before, if it is a sample."""
        now = self.clock()
        last = self._open
        self._open = _Open(now, tokens, running, self.alive, self.finished, timed)
        if last is None or not last.timed or not self._survived(last.alive, last):
            return None
        return Sample(last.tokens, now - last.started)

    @property
    def busy(self) -> bool:
        """Whether the engine's next step computes for others: the last one computed tokens,
        and not every request it ran has finished since."""
        last = self._open
        return last is not None and last.tokens > 0 and self._survived(last.running, last)

    def _survived(self, count: int, since: _Open) -> bool:
        """Whether some of ``count`` requests alive at ``since`` may still be (none finished
        since but fewer than ``count``)."""
        return count - (self.finished - since.finished) > 0
