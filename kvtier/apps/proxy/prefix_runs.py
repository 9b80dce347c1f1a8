"""Who holds a block of the proxy's index, and a prompt's runs over a fleet: the leading blocks
each engine can load, by tier.

    Holders(pairs)                     the (engine, tier) pairs holding a block (interned by the
                                       index: every block held alike shares one)
    runs_of(stretches, fleet) -> Runs  the runs of every engine of ``fleet``, from the prompt's
                                       leading stretches of blocks held alike: (holders, blocks)
    Runs.common, Runs.apart            the run of most engines; the others, each with its engines
    Runs[engine]      -> Run           one engine's run

An engine's run goes on through a stretch while it holds the stretch's blocks (in its cheapest
tier) or a shared tier does (``REDIS``: every engine loads from it). Engines are not followed one
by one but in groups that have had the same run so far: the whole fleet at first, then, at each
stretch, each group still in its run splits by the tier its engines load the stretch from (set
intersections, in C; the engines whose runs end there are taken as a set difference only if
they are not the most). A group's run is counted once. A fleet holding a prompt's system prompt
on some engines and its conversation on one or two makes three or four groups, whatever its
size: ``runs_of`` costs Python work per stretch and per group, and per engine only set
operations in C.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvtier.apps.proxy.positions import Positions

try:  # kv-aware's decision compiled (setup.py): each holder's masks kept packed for it too
    from kvtier.apps.proxy import _scoring
except ImportError:  # pragma: no cover - only where no C compiler was found at install
    _scoring = None  # type: ignore[assignment]

ENGINE = "GPU"  # the engine's own memory
SHARED = frozenset({"REDIS"})  # tiers every engine of the fleet loads from
_ORDER = {ENGINE: 0, "CPU": 1, "DISK": 2}  # cheapest first; other tiers after these


@dataclass(slots=True)
class Run:
    """An engine's leading loadable blocks of a request, counted by the tier it loads each from
    (the cheapest that holds it)."""

    blocks: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.blocks.values())


@dataclass(slots=True)
class Runs:
    """The runs of a fleet's engines: ``apart``, runs each with the engines that have it;
    ``common``, the run of every other engine of the fleet (the most, usually)."""

    common: Run
    apart: list[tuple[Run, frozenset[str]]]

    def __getitem__(self, engine: str) -> Run:
        """``engine``'s run (an engine of the fleet the runs were asked for)."""
        for run, engines in self.apart:
            if engine in engines:
                return run
        return self.common


class Holders:
    """The engines holding a block, and in which tiers: one object per way of holding, shared
    by every block held that way (``pairs``: (engine, tier) each)."""

    __slots__ = ("pairs", "uses", "_cheapest", "_ways", "_masks")

    def __init__(self, pairs: frozenset[tuple[str, str]]) -> None:
        self.pairs = pairs
        self.uses = 0  # blocks held this way
        self._cheapest: dict[str, str] | None = None  # per engine, its cheapest tier
        self._ways: _Ways | None = None
        # (lazily, for the last fleet: its masks, and them packed for ``_scoring.decide``)
        self._masks: tuple[Positions, _Masks, bytes | None] | None = None
        self.ways()  # made as the index places blocks, not when a request is routed

    def holds(self, engine: str) -> bool:
        """``engine`` holds the blocks held this way (in some tier of its own)."""
        return engine in self._by_engine()

    def _by_engine(self) -> dict[str, str]:
        cheapest = self._cheapest
        if cheapest is None:
            cheapest = self._cheapest = {}
            for engine, tier in sorted(self.pairs, key=_rank, reverse=True):
                cheapest[engine] = tier  # the cheapest, sorted last, stays
        return cheapest

    def ways(self) -> _Ways:
        """(the engines by the tier each loads these blocks from, cheapest tier first; all the
        engines; the tier every other engine loads them from: a shared one, or None)."""
        ways = self._ways
        if ways is None:
            cheapest = self._by_engine()
            engines = frozenset(cheapest)
            tiers = sorted(set(cheapest.values()), key=_tier_rank)
            by_tier = (
                ((tiers[0], engines),)  # the usual way: one tier, the same set
                if len(tiers) == 1
                else tuple((t, frozenset(e for e in engines if cheapest[e] == t)) for t in tiers)
            )
            shared = sorted((tier for _, tier in self.pairs if tier in SHARED), key=_tier_rank)
            ways = self._ways = (by_tier, engines, shared[0] if shared else None)
        return ways

    def masks(self, fleet: Positions) -> _Masks:
        """``ways()`` over ``fleet``'s positions, as bit masks (bit i: the engine at i): the
        tiers some engine of it loads these blocks from, cheapest first, each with the mask of
        its engines; the mask of them all; the tier every other engine loads them from (a
        shared one) or None. Kept for the last fleet asked (the same object); the index asks
        as it makes a holder, once a fleet was decided over (``prompt_stretches``)."""
        masks = self._masks
        if masks is None or masks[0] is not fleet:
            by_tier, _, shared = self.ways()
            bit, ways, holding = fleet.bit.__getitem__, [], 0
            for tier, those in by_tier:
                if mask := sum(map(bit, those & fleet.engines)):  # no Python step per engine
                    ways.append((tier, mask))
                    holding |= mask
            made = (tuple(ways), holding, shared)
            packed = None if _scoring is None else _scoring.pack(made, len(fleet.names))
            masks = self._masks = (fleet, made, packed)
        return masks[1]


_Ways = tuple[tuple[tuple[str, frozenset[str]], ...], frozenset[str], str | None]
_Masks = tuple[tuple[tuple[str, int], ...], int, str | None]


def runs_of(stretches: Iterable[tuple[Holders, int]], fleet: frozenset[str]) -> Runs:
    """The runs of ``fleet``'s engines through ``stretches`` (a prompt's leading blocks, in
    order: each stretch ``count`` blocks held alike), stopping once every run has ended."""
    going: list[tuple[frozenset[str], dict[str, int]]] = [(fleet, {})] if fleet else []
    # the groups whose runs ended: (how many, their engines: those of a group less the holders
    # of a stretch, taken only if needed: the most are the rest, never listed; their run)
    ended: list[tuple[int, frozenset[str], frozenset[str], dict[str, int]]] = []
    for holders, count in stretches:
        by_tier, holding, shared = holders.ways()
        groups, going = going, []
        for engines, blocks in groups:  # each group splits by the tier its engines load from
            left = len(engines)
            for tier, those in by_tier:
                part = engines & those
                if part:
                    going.append((part, _plus(blocks, tier, count)))
                    left -= len(part)
            if left and shared is not None:  # the others load the stretch from the shared tier
                going.append((engines - holding, _plus(blocks, shared, count)))
            elif left:  # or their runs end
                ended.append((left, engines, holding, blocks))
        if not going:
            break
    everyone = [(len(engines), engines, None, blocks) for engines, blocks in going] + ended
    if not everyone:
        return Runs(Run(), [])
    most = max(everyone, key=lambda group: group[0])
    apart = [(Run(group[3]), group[1] if group[2] is None else group[1] - group[2])
             for group in everyone if group is not most]  # fmt: skip
    return Runs(Run(most[3]), apart)


def _plus(blocks: dict[str, int], tier: str, count: int) -> dict[str, int]:
    """A copy of ``blocks`` with ``count`` more in ``tier``."""
    more = dict(blocks)
    more[tier] = more.get(tier, 0) + count
    return more


def _tier_rank(tier: str) -> tuple[int, str]:
    return _ORDER.get(tier, 3), tier


def _rank(pair: tuple[str, str]) -> tuple[int, str]:
    return _tier_rank(pair[1])
