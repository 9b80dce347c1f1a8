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


@dataclass
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


def cached_tokens(run: Run | None, prompt_tokens: int, block_size: int) -> int:
    """Tokens the engine need not compute: its run, less the prompt's last token (always
    computed, to sample the next one)."""
    if run is None:
        return 0
    return max(0, min(run.total * block_size, prompt_tokens - 1))


def cost(candidate: Candidate, prompt_tokens: int, block_size: int) -> float:
    run = candidate.run
    cached = cached_tokens(run, prompt_tokens, block_size)
    loaded = 0.0
    if run is not None and run.total:
        scale = cached / (run.total * block_size)  # the last token's block is computed
        for tier, blocks in run.blocks.items():
            loaded += WEIGHTS.get(tier, OTHER_WEIGHT) * blocks * block_size * scale
    return prompt_tokens - cached + loaded + candidate.queued_tokens


def choose(
    policy: str, candidates: Sequence[Candidate], prompt_tokens: int, block_size: int, turn: int
) -> Decision:
    """The engine ``policy`` picks among ``candidates`` (not empty: every one is up)."""
    if not candidates:
        raise ValueError("no engine to choose from")
    n = len(candidates)
    order = [(turn + step) % n for step in range(n)]  # round-robin breaks ties
    if policy == "round-robin":
        return Decision(order[0], "round-robin", 0)
    if policy == "least-loaded":
        best = min(order, key=lambda i: candidates[i].in_flight)
        return Decision(best, "load", 0)
    if policy != "kv-aware":
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    held = {i: cached_tokens(candidates[i].run, prompt_tokens, block_size) for i in order}
    if all(c.run is None for c in candidates):
        best = min(order, key=lambda i: (candidates[i].in_flight, candidates[i].recent))
        return Decision(best, "no-index", 0)
    if max(held.values()) == min(held.values()):  # no engine is ahead: spread the conversations
        best = min(order, key=lambda i: (candidates[i].recent, candidates[i].in_flight))
        return Decision(best, "load", held[best])
    costs = {i: cost(candidates[i], prompt_tokens, block_size) for i in order}
    best = min(order, key=lambda i: (costs[i], candidates[i].in_flight))
    return Decision(best, "prefix" if held[best] > 0 else "load", held[best])
