"""Which engine of a fleet takes a request: the routing policies.

    choose(policy, candidates, prompt_tokens, block_size, turn) -> Decision

``kv-aware`` sends a request where its time to first token is expected lowest, in units of one
prompt token computed: the tokens the engine must compute (the prompt less the leading blocks it
can load), plus those it loads, each weighted by its tier's cost against computing it
(``WEIGHTS``), plus the tokens it has yet to compute for requests already sent to it (its queue).
An engine whose index is not exact (degraded, no events) is counted as holding nothing. When no
engine holds more of the prompt than another (a new conversation: at most what every engine
holds, a shared system prompt), the request goes to the engine sent the fewest requests lately
(``recent``): conversations are spread evenly, then each stays where its history is, whichever
engine answered fastest at the start. Ties go to fewer requests in flight, then round-robin.
An engine that would then have more requests in flight than ``LOAD_BOUND`` times the fleet's
mean (or than the mean + 1, when few are in flight) is passed over: without that bound, engines
that happen not to hold a shared system prompt never get a conversation (they are never ahead,
and every new conversation saves that prompt elsewhere), while the others overflow.
``least-loaded``: fewest requests in flight (ties round-robin); ``round-robin``: each engine in
turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvtier.apps.proxy.prefix_index import Run

POLICIES = ("kv-aware", "least-loaded", "round-robin")
# a token loaded from each tier, against one computed (1.0): the engine's own memory costs
# nothing; host memory a copy; disk a read; Redis a network read
WEIGHTS: Mapping[str, float] = {"GPU": 0.0, "CPU": 0.05, "DISK": 0.2, "REDIS": 0.3}
OTHER_WEIGHT = 0.5  # a tier not named above
LOAD_BOUND = 1.25  # kv-aware: most requests in flight on an engine, against the fleet's mean


@dataclass(slots=True)
class Candidate:
    url: str
    in_flight: int
    queued_tokens: int  # prompt tokens still to compute for requests sent to it
    run: Run | None  # its leading loadable blocks of the request; None: its index is not exact
    recent: float = 0.0  # requests sent to it lately (a decaying count)


@dataclass(frozen=True)
class Decision:
    index: int  # into the candidates
    reason: str  # "prefix" (a cached prefix won), "load", "round-robin", "no-index"
    cached_tokens: int  # the prompt tokens the chosen engine is expected to load or hold


def choose(
    policy: str, candidates: Sequence[Candidate], prompt_tokens: int, block_size: int, turn: int
) -> Decision:
    """The engine ``policy`` picks among ``candidates`` (not empty: every one is up)."""
    if not candidates:
        raise ValueError("no engine to choose from")
    n = len(candidates)
    if policy == "round-robin":
        return Decision(turn % n, "round-robin", 0)
    if policy == "least-loaded":
        return Decision(_first([(c.in_flight,) for c in candidates], range(n), n, turn), "load", 0)
    if policy != "kv-aware":
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    if all(c.run is None for c in candidates):
        loads = [(c.in_flight, c.recent) for c in candidates]
        return Decision(_first(loads, range(n), n, turn), "no-index", 0)
    mean = (sum(c.in_flight for c in candidates) + 1) / n  # with this request
    bound = max(LOAD_BOUND * mean, mean + 1) - 1  # most in flight before it
    eligible, held, costs = [], [], []
    weight, last = WEIGHTS.get, prompt_tokens - 1
    for i, candidate in enumerate(candidates):
        if candidate.in_flight > bound:
            continue
        eligible.append(i)
        # the tokens it need not compute (the prompt's last one always is, to sample the next),
        # and its cost: those it computes, those it loads weighted by tier, and its queue
        run = candidate.run  # None: counted as holding nothing
        total = sum(run.blocks.values()) * block_size if run is not None else 0
        cached = total if total < last else last if last > 0 else 0
        loaded = 0.0
        if total and run is not None:
            scale = cached / total  # the last token's block is computed
            for tier, blocks in run.blocks.items():
                loaded += weight(tier, OTHER_WEIGHT) * blocks * block_size * scale
        held.append(cached)
        costs.append((prompt_tokens - cached + loaded + candidate.queued_tokens,
                      candidate.in_flight))  # fmt: skip
    if max(held) == min(held):  # no engine is ahead: spread the conversations
        lately = [(candidates[i].recent, candidates[i].in_flight) for i in eligible]
        best = _first(lately, eligible, n, turn)
        return Decision(best, "load", held[eligible.index(best)])
    best = _first(costs, eligible, n, turn)
    cached = held[eligible.index(best)]
    return Decision(best, "prefix" if cached > 0 else "load", cached)


def _first(keys: Sequence[tuple[float, ...]], indices: Sequence[int], n: int, turn: int) -> int:
    """The index whose key is least; ties to the first in round-robin order from ``turn``."""
    return min(zip(keys, [(i - turn) % n for i in indices], indices))[2]
