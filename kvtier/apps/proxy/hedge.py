"""When a request still waiting for the first byte of its answer goes to a second engine too.

    Hedge(factor, floor_s)      after ``factor`` x the recent 99th percentile of first bytes
                                (of its kind: streamed or not), ``floor_s`` at least
    Hedge.after(streamed)       seconds after sending, or None: too few answers seen yet
    Hedge.saw(streamed, s)      an answer's first byte came ``s`` seconds after its sending

An engine that stalls (a pause, a wedged device) holds its requests until its /health probe
times out (``stall.py``): seconds. A request whose first byte is later than nearly all recent
ones is sent to another engine as well, and the first to answer serves it (``resend.py``); the
other is cancelled (vLLM aborts a request whose connection closes). By construction about 1 in
100 requests or fewer is sent twice while the fleet is steady; ``factor`` 0 turns it off.
"""

from __future__ import annotations

from collections import deque

HEDGE_FLOOR_S = 0.25  # never sooner than this after the sending
WINDOW = 200  # recent first bytes per kind
MIN_SAMPLES = 20  # before any hedge: the percentile means something


class Hedge:
    def __init__(self, factor: float, floor_s: float) -> None:
        self.factor, self.floor_s = factor, floor_s
        self._seen = {kind: deque[float](maxlen=WINDOW) for kind in (False, True)}

    def after(self, streamed: bool) -> float | None:
        """Seconds after its sending that a request with no first byte yet is hedged."""
        seen = self._seen[streamed]
        if self.factor <= 0 or len(seen) < MIN_SAMPLES:
            return None
        ordered = sorted(seen)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return max(self.floor_s, self.factor * p99)

    def saw(self, streamed: bool, seconds: float) -> None:
        self._seen[streamed].append(seconds)
