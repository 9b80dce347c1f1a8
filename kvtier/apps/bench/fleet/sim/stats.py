"""What ``kvtier bench fleet``'s simulation counts of one policy's run (``loop.py``).

Spent(wall_ns, cpu_ns, digest_ns, hash_ns)   one kv-aware decision's time, and its floors
Stats                               the requests sent in the window: tokens, hits, TTFT,
                                    imbalance, decisions, the index's size
percentile(ordered, q)              a nearest-rank quantile
deep_size(root)                     the bytes an object and all it holds take
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvtier.apps.bench.fleet.sim.engine import Hit

try:  # the proxy index's compiled table, where built (setup.py)
    from kvtier.apps.proxy._digests import DigestMap as _Table
except ImportError:  # pragma: no cover - only where no C compiler was found at install
    _Table = dict  # type: ignore[misc,assignment]


class Spent(NamedTuple):
    wall_ns: int
    cpu_ns: int
    digest_ns: int  # the prompt's digests alone, every block (timed apart from ``wall_ns``)
    hash_ns: int  # the prompt's tokens hashed once, as one tuple (apart): any router's least


class Stats:
    def __init__(self) -> None:
        self.prompt_tokens = self.cached_tokens = self.gpu_tokens = 0
        self.ceiling_tokens = 0  # what caches without limit would hold (``FleetSim._ceiling``)
        self.ttft: list[float] = []
        self.imbalance: list[float] = []
        self.in_flight_sum = 0
        self.decision_ns: list[int] = []  # wall time (perf_counter_ns)
        self.decision_cpu_ns: list[int] = []  # the thread's CPU time: without preemptions
        self.digest_ns: list[int] = []  # the prompt's digests alone (wall): the per-token floor
        self.hash_ns: list[int] = []  # the prompt hashed once (wall): any router's floor
        self.index_blocks = self.index_hashes = self.index_bytes = 0

    def sent(self, n: int, hit: Hit, size: int, ttft: float, in_flight: Sequence[int]) -> None:
        cached = min((hit.gpu + hit.cpu) * size, n - 1)
        self.prompt_tokens += n
        self.cached_tokens += cached
        self.gpu_tokens += min(hit.gpu * size, cached)
        self.ttft.append(ttft)
        total = sum(in_flight)
        self.in_flight_sum += total
        self.imbalance.append(max(in_flight) * len(in_flight) / total)


def percentile(ordered: list[float] | list[int], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``ordered`` (sorted; 0.0 when empty)."""
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def deep_size(root: object) -> int:
    """``sys.getsizeof`` of ``root`` and of everything its attributes and containers hold,
    each object counted once."""
    seen: set[int] = set()
    stack: list[Any] = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, _Table):  # the index's compiled table: its keys are in its size
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.append(vars(obj))
    return total
