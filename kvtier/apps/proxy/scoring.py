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

Cost of a kv-aware decision: given ``Held`` (the index's stretches of the prompt), one compiled
call (``_scoring.decide``) follows the engines' runs through the stretches in groups alike (bit
masks over the fleet's positions, each ``Holders``' kept per fleet, packed into one buffer),
scores each group once and finds the cheapest eligible engine in one loop over the fleet's
counts, the load bound worked out from them: no Python step per stretch, group or engine.
Where ``_scoring`` is not built, or given ``Cached`` (runs already made), the same in Python:
``runs_of`` (set operations per stretch and group), each group scored, a step per engine listed
apart (``_pick``), the rest in passes in C over the fleet's counts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import add
from typing import NamedTuple

from kvtier.apps.proxy.positions import Positions
from kvtier.apps.proxy.prefix_runs import Holders, Run, runs_of

try:  # kv-aware's passes over the fleet compiled (setup.py); the same in Python where not built
    from kvtier.apps.proxy import _scoring
except ImportError:  # pragma: no cover - only where no C compiler was found at install
    _scoring = None  # type: ignore[assignment]

POLICIES = ("kv-aware", "least-loaded", "round-robin")
# a token loaded from each tier, against one computed (1.0): the engine's own memory costs
# nothing; host memory a copy; disk a read; Redis a network read
WEIGHTS: Mapping[str, float] = {"GPU": 0.0, "CPU": 0.05, "DISK": 0.2, "REDIS": 0.3}
OTHER_WEIGHT = 0.5  # a tier not named above
LOAD_BOUND = 1.25  # kv-aware: most requests in flight on an engine, against the fleet's mean


class Loads(NamedTuple):
    """What the proxy counts of the engines it may choose from, by position (one each): lists,
    or arrays of C numbers (``array('q')``, ``array('d')``), which the compiled decision reads
    in place."""

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


class Held(NamedTuple):
    """What the engines hold of the prompt, as the index found it: the prompt's leading
    ``stretches`` of blocks held alike (``PrefixIndex.prompt_stretches``), over ``fleet`` (the
    engines of the loads, in their order); ``blind`` as ``Cached``'s. Decided in one compiled
    call where ``_scoring`` is built, else made a ``Cached`` (``cached``)."""

    stretches: Sequence[tuple[Holders, int]]
    fleet: Positions
    blind: Collection[int] = ()

    def cached(self) -> Cached:
        runs = runs_of(self.stretches, self.fleet.engines)
        apart = [(run, self.fleet.of(engines)) for run, engines in runs.apart]
        return Cached(runs.common, apart, self.blind)


@dataclass(slots=True)  # not frozen: its __init__ sets three slots, no call per field
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
    cached: Cached | Held | None = None,
) -> Decision:
    """The engine ``policy`` picks among those of ``loads`` (not none: every one is up);
    ``cached``: what they hold of the prompt (None: no engine's index is exact)."""
    n = len(loads.in_flight)
    if not n:
        raise ValueError("no engine to choose from")
    if policy == "kv-aware" and type(cached) is Held and _scoring is not None:
        # compiled, the bound too: no Python step but this function's (each one, between
        # requests, meets its code and objects gone cold)
        if len(cached.fleet.names) != n:
            raise ValueError(f"the fleet has {len(cached.fleet.names)} engines, the loads {n}")
        if not cached.blind or len(frozenset(cached.blind)) < n:  # some engine's index is exact
            best, won, ahead = _scoring.decide(
                cached.stretches, cached.fleet, loads, cached.blind, prompt_tokens, block_size,
                LOAD_BOUND, turn, WEIGHTS, OTHER_WEIGHT,
            )  # fmt: skip
            return Decision(best, "prefix" if ahead and won > 0 else "load", won)  # _decision's
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
    if isinstance(cached, Held):
        if len(cached.fleet) != n:
            raise ValueError(f"the fleet has {len(cached.fleet)} engines, the loads {n}")
        cached = cached.cached()
    return _kv_aware(loads, cached, blind, prompt_tokens, block_size, turn)


def _bound(in_flight: Sequence[int], load_bound: float = LOAD_BOUND) -> float:
    """The most requests in flight an engine may have before this one (``load_bound`` times
    the mean, this request counted, or the mean + 1)."""
    mean = (sum(in_flight) + 1) / len(in_flight)  # with this request
    return max(load_bound * mean, mean + 1) - 1


def _decision(best: int, won: int, ahead: bool) -> Decision:
    if ahead:  # an eligible engine holds more of the prompt than another
        return Decision(best, "prefix" if won > 0 else "load", won)
    return Decision(best, "load", won)  # none is ahead: the conversations spread


def _kv_aware(
    loads: Loads,
    cached: Cached,
    blind: frozenset[int],
    prompt_tokens: int,
    block_size: int,
    turn: int,
) -> Decision:
    bound = _bound(loads.in_flight)
    # the prompt tokens held and the prompt's cost: of most engines, then of each group apart,
    # then of the engines without an exact index (each group's engines take the last said)
    held, cost = _score(cached.common, prompt_tokens, block_size)
    apart = [(*_score(run, prompt_tokens, block_size), at) for run, at in cached.apart]
    if blind:
        apart.append((0, float(prompt_tokens), blind))
    return _decision(*_pick(loads, held, cost, apart, bound, turn))


_Apart = Sequence[tuple[int, float, Iterable[int]]]  # (held, cost, the engines' positions)


def _pick(
    loads: Loads, held: int, cost: float, apart: _Apart, bound: float, turn: int
) -> tuple[int, int, bool]:
    """Each engine holding ``held`` prompt tokens at ``cost``, but those of each group of
    ``apart`` (in order: a later group overrides); of the eligible engines (in flight <=
    ``bound``; one at least), the one of least (cost and queue, in flight), what it holds, and
    whether an eligible engine holds more or less of the prompt; if none does, the one of least
    (recent, in flight), what it holds, and False. Ties to the first in round-robin order from
    ``turn``. (``_scoring.decide``, compiled, does the same in one loop over the engines.)"""
    in_flight = loads.in_flight
    n = len(in_flight)
    helds, costs = [held] * n, [cost] * n
    for group_held, group_cost, at in apart:
        for i in at:
            helds[i], costs[i] = group_held, group_cost
    eligible = list(map(bound.__ge__, in_flight))
    keys = list(zip(map(add, costs, loads.queued), in_flight))
    best = _first_from(keys, min(compress(keys, eligible)), turn)
    if any(compress(map(helds[best].__ne__, helds), eligible)):
        return best, helds[best], True
    best = _first(list(zip(loads.recent, in_flight)), eligible, turn)
    return best, helds[best], False


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
