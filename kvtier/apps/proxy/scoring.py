"""Which engine of a fleet takes a request: the routing policies.

    choose(policy, loads, prompt_tokens, block_size, turn, cached) -> Decision
    Loads(in_flight, queued, recent)    each engine's counts, by position (every policy's input)
    Cached(common, apart, blind)        what they hold of the prompt (kv-aware's): the run of
                                        most, the others with their engines' positions, and
                                        the engines without an exact index

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

Cost of a kv-aware decision: the engines come in a few groups alike (``PrefixIndex.runs``: the
most, sharing one run, and the others with the engines that have each run; ``blind``), and each
group is scored once. The groups are searched cheapest first, one Python step per engine of a
group listed, and stop at the first group that cannot beat the best found; the most (the rest)
are searched, when they must be, with passes in C over the fleet's counts. No Python object is
made per engine: the work grows with the engines holding part of the prompt that the most do
not, and the fleet's size costs only passes in C (the load bound, the shortest queue).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import NamedTuple

from kvtier.apps.proxy.prefix_runs import Run

POLICIES = ("kv-aware", "least-loaded", "round-robin")
# a token loaded from each tier, against one computed (1.0): the engine's own memory costs
# nothing; host memory a copy; disk a read; Redis a network read
WEIGHTS: Mapping[str, float] = {"GPU": 0.0, "CPU": 0.05, "DISK": 0.2, "REDIS": 0.3}
OTHER_WEIGHT = 0.5  # a tier not named above
LOAD_BOUND = 1.25  # kv-aware: most requests in flight on an engine, against the fleet's mean


class Loads(NamedTuple):
    """What the proxy counts of the engines it may choose from, by position (one each)."""

    in_flight: Sequence[int]  # requests sent to it, not yet answered
    queued: Sequence[int]  # prompt tokens still to compute for requests sent to it
    recent: Sequence[float]  # requests sent to it lately (a decaying count)


class Cached(NamedTuple):
    """What the engines hold of the prompt: ``apart``, runs each with its engines' positions;
    ``common``, the run of every other engine; ``blind``, the positions whose index is not exact
    (counted as holding nothing, whatever ``apart`` says)."""

    common: Run
    apart: Sequence[tuple[Run, Iterable[int]]] = ()
    blind: Collection[int] = ()


@dataclass(frozen=True)
class Decision:
    index: int  # the engine's position
    reason: str  # "prefix" (a cached prefix won), "load", "round-robin", "no-index"
    cached_tokens: int  # the prompt tokens the chosen engine is expected to load or hold


def choose(
    policy: str,
    loads: Loads,
    prompt_tokens: int,
    block_size: int,
    turn: int,
    cached: Cached | None = None,
) -> Decision:
    """The engine ``policy`` picks among those of ``loads`` (not none: every one is up);
    ``cached``: what they hold of the prompt (None: no engine's index is exact)."""
    n = len(loads.in_flight)
    if not n:
        raise ValueError("no engine to choose from")
    if policy == "round-robin":
        return Decision(turn % n, "round-robin", 0)
    if policy == "least-loaded":
        return Decision(_first(list(zip(loads.in_flight)), None, turn), "load", 0)
    if policy != "kv-aware":
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    blind = frozenset(cached.blind) if cached is not None else None
    if blind is None or cached is None or len(blind) == n:  # no engine's index is exact
        keys = list(zip(loads.in_flight, loads.recent))
        return Decision(_first(keys, None, turn), "no-index", 0)
    return _kv_aware(loads, cached, blind, prompt_tokens, block_size, turn)


class _Group(NamedTuple):
    """Engines alike: holding as much of the prompt, so costing as much but for the queue."""

    held: int  # the prompt tokens they need not compute
    cost: float  # the prompt's cost there, but for the queue
    at: list[int] | None  # their positions; None: every engine in no other group (the rest)


_Found = tuple[tuple[float, int], int, int]  # ((cost, in flight), its turn, position)
_NEVER = (math.inf, 0)  # a key no engine has


def _kv_aware(
    loads: Loads,
    cached: Cached,
    blind: frozenset[int],
    prompt_tokens: int,
    block_size: int,
    turn: int,
) -> Decision:
    in_flight = loads.in_flight
    mean = (sum(in_flight) + 1) / len(in_flight)  # with this request
    bound = max(LOAD_BOUND * mean, mean + 1) - 1  # most in flight before it
    groups = [
        _Group(*_score(run, prompt_tokens, block_size),
               list(at) if not blind else [i for i in at if i not in blind])
        for run, at in cached.apart
    ]  # fmt: skip
    if blind:
        groups.append(_Group(0, float(prompt_tokens), sorted(blind)))  # holding nothing
    listed: set[int] = set()  # the engines in a group: the rest are the others
    for group in groups:
        listed.update(group.at or ())
    groups.append(_Group(*_score(cached.common, prompt_tokens, block_size), None))
    if len({group.held for group in groups}) > 1:  # an engine may be ahead
        best, won = _cheapest(groups, listed, loads, bound, turn)
        if any(g.held != won.held and _any_eligible(g, listed, in_flight, bound) for g in groups):
            return Decision(best, "prefix" if won.held > 0 else "load", won.held)
    # no eligible engine is ahead: spread the conversations
    best = _first(list(zip(loads.recent, in_flight)), [f <= bound for f in in_flight], turn)
    won = next(g for g in groups if (best in g.at if g.at is not None else best not in listed))
    return Decision(best, "load", won.held)


def _any_eligible(group: _Group, listed: set[int], in_flight: Sequence[int], bound: float) -> bool:
    if group.at is not None:
        return any(in_flight[i] <= bound for i in group.at)
    return any(f <= bound for i, f in enumerate(in_flight) if i not in listed)


def _cheapest(
    groups: list[_Group], listed: set[int], loads: Loads, bound: float, turn: int
) -> tuple[int, _Group]:
    """The eligible engine (in flight <= ``bound``) of least (cost, in flight), ties to the first
    in round-robin order from ``turn``; and its group. Groups are searched cheapest first, until
    one whose cost with the shortest queue of all is above the best found: no engine of it, nor
    of any after it, can win. A group listed is searched engine by engine; the rest in C."""
    floor = min(loads.queued)
    best: _Found | None = None
    won = groups[-1]
    for group in sorted(groups, key=lambda g: g.cost):
        if best is not None and best[0][0] < group.cost + floor:
            break
        if group.at is not None:
            found = _cheapest_listed(group.at, group.cost, loads, bound, turn)
        else:
            found = _cheapest_rest(listed, group.cost, loads, bound, turn)
        if found is not None and (best is None or found < best):
            best, won = found, group
    assert best is not None  # some engine is eligible: the least in flight is
    return best[2], won


def _cheapest_listed(
    at: list[int], cost: float, loads: Loads, bound: float, turn: int
) -> _Found | None:
    in_flight, queued, n = loads.in_flight, loads.queued, len(loads.in_flight)
    best = None
    for i in at:
        if in_flight[i] <= bound:
            found = ((cost + queued[i], in_flight[i]), (i - turn) % n, i)
            if best is None or found < best:
                best = found
    return best


def _cheapest_rest(
    listed: set[int], cost: float, loads: Loads, bound: float, turn: int
) -> _Found | None:
    in_flight = loads.in_flight
    keys = list(zip(map(cost.__add__, loads.queued), in_flight))
    for i in listed:
        keys[i] = _NEVER
    least = min(compress(keys, [f <= bound for f in in_flight]), default=_NEVER)
    if least is _NEVER:
        return None
    i = _first_from(keys, least, turn)
    return least, (i - turn) % len(keys), i


def _score(run: Run, prompt_tokens: int, block_size: int) -> tuple[int, float]:
    """The prompt tokens an engine with ``run`` need not compute (the last one always is, to
    sample the next), and the cost of the prompt there, in tokens computed: the others, plus
    those it loads, weighted by tier."""
    total = sum(run.blocks.values()) * block_size
    last = prompt_tokens - 1
    cached = total if total < last else last if last > 0 else 0
    loaded = 0.0
    if total:
        scale = cached / total  # the last token's block is computed
        for tier, blocks in run.blocks.items():
            loaded += WEIGHTS.get(tier, OTHER_WEIGHT) * blocks * block_size * scale
    return cached, prompt_tokens - cached + loaded


def _first(keys: Sequence[tuple[float, ...]], allowed: list[bool] | None, turn: int) -> int:
    """The position of the least of ``keys`` (of those ``allowed``; None: all); ties to the
    first in round-robin order from ``turn``. Keys alike must be allowed alike (here ``allowed``
    follows a key's last item: in flight)."""
    return _first_from(keys, min(keys if allowed is None else compress(keys, allowed)), turn)


def _first_from(keys: Sequence[tuple[float, ...]], key: tuple[float, ...], turn: int) -> int:
    """The first position of ``key`` in ``keys`` in round-robin order from ``turn``."""
    start = turn % len(keys)
    try:
        return keys.index(key, start)
    except ValueError:
        return keys.index(key, 0, start)
