"""The circuit breaker of the Redis tier: a Redis that failed is not asked again for a while.

After a failure (a connection error, a timeout) the breaker opens for 0.5 s, doubling on each
failure in a row up to 30 s; meanwhile every call fails at once (``RedisUnavailable``) without
touching the network, so an engine step never waits on a Redis that is down. After the window
one call is let through to try; a success closes the breaker and resets the window.
"""

from __future__ import annotations

import threading
import time

BREAKER_FIRST_S = 0.5
BREAKER_MAX_S = 30.0


class RedisUnavailable(OSError):
    """Redis is down, slow, or its circuit breaker is open: a miss, a skipped store."""


class Breaker:
    """Open for a window after a failure (0.5 s, doubling, up to 30 s); then one trial."""

    def __init__(self, trial_s: float) -> None:
        self.failures = 0
        self.open_until = 0.0
        self.trial_s = trial_s  # how long one trial may take before another thread tries
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return time.monotonic() >= self.open_until

    def enter(self) -> None:
        """Raise RedisUnavailable while open; after the window let one caller through."""
        with self._lock:
            now = time.monotonic()
            if now < self.open_until:
                raise RedisUnavailable("Redis circuit breaker open (Redis failed recently)")
            if self.failures:  # the trial call: the others wait for its outcome
                self.open_until = now + self.trial_s

    def succeeded(self) -> None:
        if self.failures or self.open_until:
            with self._lock:
                self.failures, self.open_until = 0, 0.0

    def failed(self) -> float:
        """Open the breaker; returns its window."""
        with self._lock:
            self.failures += 1
            window = min(BREAKER_MAX_S, BREAKER_FIRST_S * 2.0 ** (self.failures - 1))
            self.open_until = time.monotonic() + window
            return window
