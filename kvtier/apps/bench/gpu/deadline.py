"""A bound on each measure's time, so that one that hangs costs its own figures, not the run.

with deadline(seconds, stuck):   ``MeasureTimeout`` is raised in this (the main) thread
                                 after ``seconds`` (SIGALRM: a blocking socket or lock wait
                                 is interrupted, and the measure's cleanup runs); if the
                                 thread is still stuck ``GRACE_S`` later (inside a C call
                                 that no signal interrupts: a device synchronize), ``stuck``
                                 is called on a timer thread, and should end the process
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

GRACE_S = 60.0


class MeasureTimeout(Exception):
    """A measure ran past its deadline."""


@contextmanager
def deadline(seconds: float, stuck: Callable[[], None]) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise MeasureTimeout(f"still running after {seconds:.0f} s (--limit-s)")

    soft = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, expire) if soft else None
    if soft:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    hard = threading.Timer(seconds + GRACE_S, stuck)
    hard.daemon = True
    hard.start()
    try:
        yield
    finally:
        hard.cancel()
        if soft:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
