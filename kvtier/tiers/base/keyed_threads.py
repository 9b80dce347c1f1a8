"""Keyed threads: work with one key runs in order on one thread, different keys side by side.

    KeyedThreads(name, threads, initializer, initargs)
    submit(key, fn) -> Future      on the thread of ``key``
    shutdown(wait)                 finish what is queued (``wait``: and join the threads)

Keys take threads round-robin in the order they first appear, so up to ``threads`` distinct keys
never share one. What this buys a decode engine pulling from several prefill engines: a peer
that hangs until its timeout holds up only the pulls from that peer, not everyone's.
Threads start on their first job, so a lane no key uses costs nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
MAX_KEYS = 4096  # keys remembered; past this the round-robin starts over (peers churn slowly)


class KeyedThreads:
    def __init__(
        self,
        name: str,
        threads: int,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        if threads < 1:
            raise ValueError(f"{name}: threads must be >= 1, got {threads}")
        self._pools = [
            ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=name if threads == 1 else f"{name}-{i}",
                initializer=initializer, initargs=initargs,
            )
            for i in range(threads)
        ]  # fmt: skip
        self._lock = threading.Lock()
        self._lane: dict[Hashable, int] = {}
        self._next = 0

    def submit(self, key: Hashable, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` after the work submitted before with ``key``; raises ``RuntimeError``
        after ``shutdown``."""
        with self._lock:
            lane = self._lane.get(key)
            if lane is None:
                if len(self._lane) >= MAX_KEYS:
                    self._lane.clear()
                lane = self._lane[key] = self._next
                self._next = (self._next + 1) % len(self._pools)
        return self._pools[lane].submit(fn)

    def shutdown(self, wait: bool = True) -> None:
        for pool in self._pools:  # stop taking work everywhere first, then wait
            pool.shutdown(wait=False)
        if wait:
            for pool in self._pools:
                pool.shutdown(wait=True)
