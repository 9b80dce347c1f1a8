"""The proxy's choice (``scoring.choose`` over ``PrefixIndex.runs``: the run most engines share,
the others' apart) against a plain reference of its rules, engine by engine, over random fleets:
what each engine holds, the load, engines without an exact index, whose turn it is. The same
engine, reason and cached tokens every time."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

import pytest

from kvtier.apps.proxy import prefix_index, scoring
from kvtier.apps.proxy.kv_events import Event, Kind
from kvtier.apps.proxy.positions import Positions
from kvtier.apps.proxy.prefix_index import PrefixIndex, Run
from kvtier.apps.proxy.scoring import Cached, Decision, Held, Loads, choose

BS = 2  # tokens per block
TIERS = ("GPU", "CPU", "DISK", "REDIS", "NVME")  # REDIS: shared; NVME: a tier not weighed
RANK = {"GPU": 0, "CPU": 1, "DISK": 2}  # cheapest first, then the others by name
MASK = (1 << 64) - 1


class Engine(NamedTuple):
    in_flight: int
    queued: int
    run: Run | None  # None: its index is not exact
    recent: float


# ---- the reference: today's rules, written plainly, engine by engine


def reference_run(holds: dict[tuple[str, tuple[int, ...]], set[str]], engine: str,
                  tokens: list[int]) -> Run:  # fmt: skip
    """Block by block: the engine's cheapest tier holding it, else a shared tier any engine put
    it in, else the run ends."""
    blocks: dict[str, int] = {}
    for end in range(BS, len(tokens) + 1, BS):
        prefix = tuple(tokens[:end])
        mine = holds.get((engine, prefix), set())
        shared = any("REDIS" in tiers for (_, p), tiers in holds.items() if p == prefix)
        if mine:
            tier = min(mine, key=lambda t: (RANK.get(t, 3), t))
        elif shared:
            tier = "REDIS"
        else:
            break
        blocks[tier] = blocks.get(tier, 0) + 1
    return Run(blocks)


def reference_choose(policy: str, engines: list[Engine], prompt: int, turn: int) -> Decision:
    n = len(engines)

    def rr(i: int) -> int:
        return (i - turn) % n

    if policy == "round-robin":
        return Decision(turn % n, "round-robin", 0)
    if policy == "least-loaded":
        return Decision(min(range(n), key=lambda i: (engines[i].in_flight, rr(i))), "load", 0)
    if all(e.run is None for e in engines):
        best = min(range(n), key=lambda i: (engines[i].in_flight, engines[i].recent, rr(i)))
        return Decision(best, "no-index", 0)
    mean = (sum(e.in_flight for e in engines) + 1) / n
    bound = max(scoring.LOAD_BOUND * mean, mean + 1) - 1
    eligible = [i for i in range(n) if engines[i].in_flight <= bound]
    cached, cost = {}, {}
    for i in eligible:
        run = engines[i].run
        total = run.total * BS if run is not None else 0
        cached[i] = min(total, max(prompt - 1, 0))
        loaded = 0.0
        if run is not None and total:
            for tier, blocks in run.blocks.items():
                weight = scoring.WEIGHTS.get(tier, scoring.OTHER_WEIGHT)
                loaded += weight * blocks * BS * (cached[i] / total)
        cost[i] = prompt - cached[i] + loaded + engines[i].queued
    if max(cached.values()) == min(cached.values()):
        best = min(eligible, key=lambda i: (engines[i].recent, engines[i].in_flight, rr(i)))
        return Decision(best, "load", cached[best])
    best = min(eligible, key=lambda i: (cost[i], engines[i].in_flight, rr(i)))
    return Decision(best, "prefix" if cached[best] > 0 else "load", cached[best])


# ---- random fleets


@dataclass(frozen=True)
class Fleet:
    index: PrefixIndex
    names: list[str]
    holds: dict[tuple[str, tuple[int, ...]], set[str]]  # (engine, a prompt's prefix) -> tiers
    prompts: list[list[int]]


def _tokens(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(1 << 16) for _ in range(blocks * BS)]


def random_fleet(rng: random.Random) -> Fleet:
    index = PrefixIndex()
    names = [f"e{i}" for i in range(rng.randint(1, 9))]
    known = names + ["gone"] * (rng.random() < 0.2)  # one the index knows, not in the fleet
    system = _tokens(rng, rng.randint(0, 4))
    prompts = [system + _tokens(rng, rng.randint(1, 5)) for _ in range(3)]
    everyone = rng.random() < 0.6  # every engine holds the system prompt in its memory
    holds: dict[tuple[str, tuple[int, ...]], set[str]] = {}
    hashes: dict[tuple[str, tuple[int, ...]], int] = {}  # the engine's own, salted

    def store(engine: str, tokens: list[int], tier: str) -> None:
        ends = range(BS, len(tokens) + 1, BS)
        for end in ends:
            prefix = tuple(tokens[:end])
            hashes[engine, prefix] = hash((engine, prefix)) & MASK
            holds.setdefault((engine, prefix), set()).add(tier)
        own = tuple(hashes[engine, tuple(tokens[:end])] for end in ends)
        index.apply(engine, [Event(Kind.STORED, own, None, tuple(tokens), BS, tier)])

    for engine in known:
        if everyone and system:
            store(engine, system, "GPU")
        for tier in TIERS:
            if rng.random() < 0.35:
                prompt = rng.choice(prompts)
                store(engine, prompt[: rng.randint(1, len(prompt) // BS) * BS], tier)
    for _ in range(rng.randint(0, 4)):  # removals, a cleared memory, a dropped engine
        held = [key for key, tiers in holds.items() if tiers]
        if not held:
            break
        engine, prefix = rng.choice(held)
        if rng.random() < 0.15:
            index.apply(engine, [Event(Kind.CLEARED)])
            for (e, _), tiers in holds.items():
                if e == engine:
                    tiers.discard("GPU")
        elif rng.random() < 0.1:
            index.drop(engine)
            holds = {key: tiers for key, tiers in holds.items() if key[0] != engine}
        else:
            tier = rng.choice(sorted(holds[engine, prefix]))
            index.apply(engine, [Event(Kind.REMOVED, (hashes[engine, prefix],), medium=tier)])
            holds[engine, prefix].discard(tier)
    return Fleet(index, names, holds, prompts)


def random_prompt(rng: random.Random, fleet: Fleet) -> list[int]:
    prompt = rng.choice(fleet.prompts)
    prompt = prompt[: rng.randint(0, len(prompt))] + _tokens(rng, rng.randint(0, 2))
    return prompt[: len(prompt) - rng.randint(0, 1)]  # sometimes a partial last block


@pytest.fixture(params=["compiled", "python"])
def compiled(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The proxy's compiled digests, table and pick (``_digests``, ``_scoring``), or the Python
    a proxy installed without a C compiler runs."""
    if request.param == "python":
        monkeypatch.setattr(prefix_index, "_digests", None)
        monkeypatch.setattr(scoring, "_scoring", None)
    return request.param == "compiled"


@pytest.mark.parametrize("seed", range(3))
def test_the_choice_is_the_reference_rules_choice(seed: int, compiled: bool) -> None:
    rng = random.Random(seed)
    seen: Counter[str] = Counter()
    for _ in range(300):
        fleet = random_fleet(rng)
        assert isinstance(fleet.index._holders, dict) is not compiled
        index, names, n = fleet.index, fleet.names, len(fleet.names)
        for _ in range(6):
            prompt = random_prompt(rng, fleet)
            runs = index.runs(index.digests(prompt), names) if index.block_size else None
            if runs is not None:
                assert index.prompt_runs(prompt, names) == runs
            expected = [reference_run(fleet.holds, name, prompt) for name in names]
            if runs is not None:
                for name, run in zip(names, expected, strict=True):
                    assert runs[name] == run and list(runs[name].blocks) == list(run.blocks)
                seen["others apart from a run held"] += bool(runs.apart) and runs.common.total > 0
            blind = [i for i in range(n) if rng.random() < 0.15]
            in_flight = [rng.randint(0, 4) for _ in range(n)]
            queued = [rng.choice((0, 2, 4, 8, -3)) for _ in range(n)]  # (-3: any count)
            recent = [rng.choice((0.0, 0.5, 1.0)) for _ in range(n)]
            turn = rng.randint(0, 20)
            engines = [
                Engine(f, q, None if runs is None or i in blind else expected[i], r)
                for i, (f, q, r) in enumerate(zip(in_flight, queued, recent, strict=True))
            ]
            cached = None
            if runs is not None:
                apart = [(run, [names.index(e) for e in members]) for run, members in runs.apart]
                cached = Cached(runs.common, apart, blind)
            loads = Loads(in_flight, queued, recent)
            held = Held(index.prompt_stretches(prompt), Positions(names), blind)
            for policy in scoring.POLICIES:
                decision = choose(policy, loads, len(prompt), BS, turn, cached)
                assert decision == reference_choose(policy, engines, len(prompt), turn)
                if runs is not None:  # the index's stretches, decided in one call
                    assert choose(policy, loads, len(prompt), BS, turn, held) == decision
                seen[f"{policy} {decision.reason}"] += 1
            mean = (sum(in_flight) + 1) / n
            past = max(in_flight) > max(scoring.LOAD_BOUND * mean, mean + 1) - 1
            seen["an engine past the load bound"] += past
    # the random fleets went through every rule
    for case in ("kv-aware prefix", "kv-aware load", "kv-aware no-index",
                 "an engine past the load bound", "others apart from a run held"):  # fmt: skip
        assert seen[case] >= 20, (case, seen)
