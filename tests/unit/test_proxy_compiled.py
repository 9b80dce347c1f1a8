"""The proxy's compiled per-decision work (``_digests.c``, ``_scoring.c``, built by setup.py)
against the Python it stands for: the same digests, a table that behaves as a dict, the same
stretches, the same pick. The modules are optional for a user (no compiler: Python), but this
install must have built them, or the proxy would be slow without a word."""

from __future__ import annotations

import math
import random
import sys
from array import array

import pytest

from kvtier.apps.proxy import prefix_index, scoring
from kvtier.apps.proxy.positions import Positions
from kvtier.apps.proxy.prefix_index import _chained
from kvtier.apps.proxy.prefix_runs import Holders
from kvtier.apps.proxy.scoring import Loads

_digests = prefix_index._digests
_scoring = scoring._scoring


def test_the_compiled_modules_were_built_and_are_used() -> None:
    assert _digests is not None and _scoring is not None, "setup.py's extensions were not built"
    assert isinstance(prefix_index.PrefixIndex()._holders, _digests.DigestMap)


def _token(rng: random.Random) -> int:
    """Mostly vocabulary ids; now and then what hashes unlike itself (negative, past 2**61, a
    bool) or takes more than one 30-bit digit."""
    return rng.choice((rng.randrange(1 << 17), rng.randrange(1 << 17), rng.randrange(1 << 31),
                       -rng.randrange(3), 1 << 70, (1 << 61) - 1, True))  # fmt: skip


def test_chained_digests_are_pythons() -> None:
    rng = random.Random(0)
    for _ in range(2_000):
        size = rng.choice((1, 2, 3, 4, 16))
        tokens = [_token(rng) for _ in range(rng.randrange(0, 120))]
        start = rng.choice((0, (3 << 96) + 12345, (5 << 96) - (1 << 62)))
        assert _digests.chained(start, tokens, size) == list(_chained(start, tokens, size))
    assert _digests.chained(0, tuple(range(8)), 4) == list(_chained(0, range(8), 4))


@pytest.mark.parametrize("size", [300, 1500])
def test_large_blocks_are_digested_as_in_python(size: int) -> None:
    """Blocks read a few at a time (300 tokens: 3 of the 1,024 read ahead) or one at a time
    (1,500: more than are read ahead)."""
    rng = random.Random(size)
    tokens = [_token(rng) for _ in range(11 * size + 7)]
    digests = list(_chained(0, tokens, size))
    assert _digests.chained(0, tokens, size) == digests
    table = _digests.DigestMap[str]()
    for digest in digests[:9]:
        table[digest] = "held"
    assert table.stretches(tokens, size) == [("held", 9)]


def test_chained_rejects_what_is_not_a_prompt() -> None:
    with pytest.raises(ValueError, match="size must be > 0; got 0"):
        _digests.chained(0, [1, 2], 0)
    with pytest.raises(TypeError, match="tokens must be a sequence"):
        _digests.chained(0, 5, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        _digests.chained(0, [[1], 2], 2)  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        _digests.chained(1 << 130, [1, 2], 2)


def test_digest_map_behaves_as_a_dict() -> None:
    rng = random.Random(1)
    table, model = _digests.DigestMap[object](), dict[int, object]()
    values = [object() for _ in range(9)]
    keys = [rng.randrange(-(1 << 100), 1 << 120) for _ in range(2_000)] + list(range(40))
    for _ in range(60_000):  # growth, and deletions that shift probed entries back
        key = rng.choice(keys)
        if rng.random() < 0.55:
            table[key] = model[key] = rng.choice(values)
        elif key in model:
            del table[key], model[key]
        else:
            with pytest.raises(KeyError):
                del table[key]
        assert len(table) == len(model)
    for key in keys:
        assert table.get(key) is model.get(key) and (key in table) == (key in model)
        assert table.get(key, values[0]) is model.get(key, values[0])
    assert sorted(map(id, table.values())) == sorted(map(id, model.values()))
    with pytest.raises(KeyError):
        table[1 << 110]
    with pytest.raises(TypeError, match="digest must be an int, not str"):
        table.get("x")  # type: ignore[arg-type]


def test_a_digest_map_past_a_huge_page_keeps_every_key() -> None:
    """A table of 2 MB or more is mapped apart (on huge pages where the kernel has them):
    grown into, rehashed from, emptied and freed as the small one."""
    rng = random.Random(2)
    keys = list({rng.getrandbits(100) for _ in range(150_000)})  # 2**18 slots of 32 B: 8 MB
    table = _digests.DigestMap[int]()
    for i, key in enumerate(keys):
        table[key] = i
    assert len(table) == len(keys) and table.__sizeof__() > 8 << 20
    assert all(table[key] == i for i, key in enumerate(keys))
    for key in keys[::2]:
        del table[key]
    assert len(table) == len(keys) // 2
    assert all(table.get(key) == (None if i % 2 == 0 else i) for i, key in enumerate(keys))
    del table


def test_digest_map_owns_its_references() -> None:
    held = object()
    before = sys.getrefcount(held)
    table = _digests.DigestMap[object]()
    table[1] = held
    table[2] = held
    table[2] = held  # replaced: one reference, not two
    assert sys.getrefcount(held) == before + 2
    del table[1]
    assert sys.getrefcount(held) == before + 1
    del table
    assert sys.getrefcount(held) == before


def test_stretches_are_the_lookups_in_python() -> None:
    """A prompt's leading blocks found, grouped by the same holder, up to the first not found."""
    rng = random.Random(2)
    for _ in range(300):
        size = rng.choice((1, 2, 4))
        tokens = [rng.randrange(50) for _ in range(rng.randrange(0, 80))]
        digests = list(_chained(0, tokens, size))
        holders = [object() for _ in range(3)]
        table, model = _digests.DigestMap[object](), {}
        for digest in digests:
            if rng.random() < 0.9:
                table[digest] = model[digest] = rng.choice(holders[: rng.randint(1, 3)])
        index = prefix_index.PrefixIndex()
        index._holders = model  # type: ignore[assignment]
        expected = index._stretches(iter(digests))
        assert table.stretches(tokens, size) == expected
        assert table.stretches(tokens + [1] * (size - 1), size) == expected  # a partial block


def test_pick_is_the_python_passes() -> None:
    """What ``decide`` does after the runs (each engine's group, the cheapest eligible one),
    against ``_pick``: the fleet's engines in groups by mask, no stretch to follow."""
    rng = random.Random(3)
    for _ in range(3_000):
        n = rng.randint(1, 70)
        names = [f"e{i}" for i in range(n)]
        in_flight = [rng.randint(0, 4) for _ in range(n)]
        queued = [rng.choice((0, 2, 4, 8, -3)) for _ in range(n)]
        recent = [rng.choice((0.0, 0.5, 1.0)) for _ in range(n)]
        loads = Loads(in_flight, queued, recent)
        # one stretch: some engines hold it in CPU; the others' runs end
        holding = [i for i in range(n) if rng.random() < 0.5]
        blocks, prompt = rng.randint(1, 5), rng.randint(1, 30)
        holders = Holders(frozenset((names[i], "CPU") for i in holding))
        blind = [i for i in range(n) if rng.random() < 0.1]
        load_bound = rng.choice((0.5, 1.0, 1.25, 2.0, 3.5))
        bound = scoring._bound(in_flight, load_bound)
        turn = rng.randint(-3, 30)
        fleet = Positions(names)
        stretches = [(holders, blocks)] if holding else []
        decided = _scoring.decide(stretches, fleet, loads, blind, prompt, 2, load_bound, turn,
                                  scoring.WEIGHTS, scoring.OTHER_WEIGHT)  # fmt: skip
        run = scoring.Run({"CPU": blocks})
        held, cost = scoring._score(run, prompt, 2)
        empty_held, empty_cost = scoring._score(scoring.Run(), prompt, 2)
        apart = [(held, cost, holding), (0, float(prompt), blind)]
        assert decided == scoring._pick(loads, empty_held, empty_cost, apart, bound, turn)
        if holding:  # the masks packed by decide, not kept packed: the same
            holders._masks = (fleet, holders.masks(fleet), None)
            assert _scoring.decide(stretches, fleet, loads, blind, prompt, 2, load_bound, turn,
                                   scoring.WEIGHTS, scoring.OTHER_WEIGHT) == decided  # fmt: skip
        arrays = Loads(array("q", in_flight), array("q", queued), array("d", recent))
        assert _scoring.decide(stretches, fleet, arrays, blind, prompt, 2, load_bound, turn,
                               scoring.WEIGHTS, scoring.OTHER_WEIGHT) == decided  # fmt: skip


def test_decide_names_a_bad_argument() -> None:
    fleet, held = Positions(["a", "b"]), Holders(frozenset({("a", "GPU")}))
    loads = Loads([0, 0], [0, 0], [0.0, 0.0])

    def decide(loads: Loads = loads, stretches: object = ((held, 1),), blind: object = ()) -> None:
        _scoring.decide(stretches, fleet, loads, blind, 8, 2, 1.0, 0, {}, 0.5)  # type: ignore[arg-type]

    decide()
    with pytest.raises(ValueError, match="queued has 1 engines, in_flight 2"):
        decide(Loads([0, 0], [0], [0.0, 0.0]))
    with pytest.raises(ValueError, match="recent has 1 engines, in_flight 2"):
        decide(Loads(array("q", [0, 0]), array("q", [0, 0]), array("d", [0.0])))
    decide(Loads(array("i", [0, 0]), bytes(2), array("f", [0.0, 0.0])))  # read as sequences
    with pytest.raises(TypeError, match="recent"):
        decide(Loads([0, 0], [0, 0], 0.5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no engine is eligible"):
        decide(Loads([math.nan, math.nan], [0, 0], [0.0, 0.0]))
    with pytest.raises(IndexError, match="blind position 2 of a fleet of 2"):
        decide(blind=[2])
    with pytest.raises(TypeError, match="a stretch must be"):
        decide(stretches=[held])
    overlapping = Holders(frozenset({("a", "GPU")}))
    ways = tuple((tier, 0b11) for tier in ("GPU", "CPU", "DISK", "NVME"))  # 4 groups of 2 engines
    overlapping._masks = (fleet, (ways, 0b11, None), None)  # not packed: packed by decide
    with pytest.raises(ValueError, match="an engine in two tiers' masks"):  # never past its room
        decide(stretches=[(overlapping, 1)])
    b_holds = Holders(frozenset({("b", "GPU")}))  # "b": bit 1, past a fleet of one
    with pytest.raises(ValueError, match="masks packed for a fleet of 2 engines, not 1"):
        _scoring.decide([(b_holds, 1)], fleet, Loads([0], [0], [0.0]), (), 8, 2, 1.0, 0, {}, 0.5)
    b_holds._masks = (fleet, b_holds.masks(fleet), None)  # packed by decide: the mask is past
    with pytest.raises(ValueError, match="a mask past the fleet"):
        _scoring.decide([(b_holds, 1)], fleet, Loads([0], [0], [0.0]), (), 8, 2, 1.0, 0, {}, 0.5)
    with pytest.raises(ValueError, match="a mask past the fleet"):
        _scoring.pack(((("GPU", 0b100),), 0b100, None), 2)
    with pytest.raises(TypeError, match="a way must be"):
        _scoring.pack((("GPU",), 0, None), 2)
    with pytest.raises(ValueError, match="engines must be >= 0; got -1"):
        _scoring.pack(((), 0, None), -1)


def test_a_holder_that_keeps_no_masks_is_asked_for_them() -> None:
    """``decide`` reads a holder's masks packed where it kept them, else asks ``masks(fleet)``
    and packs what it answers: the same decision either way."""
    fleet = Positions(["a", "b", "c"])
    kept = Holders(frozenset({("b", "GPU"), ("c", "CPU")}))

    class Asked:
        _masks = None

        def __init__(self) -> None:
            self.asked = 0

        def masks(self, fleet: Positions) -> object:
            self.asked += 1
            return Holders(kept.pairs).masks(fleet)

    asked = Asked()
    loads = Loads([0, 0, 0], [0, 0, 0], [0.0, 0.0, 0.0])
    args = (fleet, loads, (), 40, 4, scoring.LOAD_BOUND, 0, scoring.WEIGHTS, scoring.OTHER_WEIGHT)
    decided = _scoring.decide([(kept, 3)], *args)
    assert decided == (1, 12, True)  # "b" holds the 3 blocks in its own memory
    assert _scoring.decide([(asked, 3)], *args) == decided  # type: ignore[list-item]
    assert _scoring.decide([(asked, 3), (asked, 1)], *args) == (1, 16, True)  # type: ignore[list-item]
    assert asked.asked == 3


def test_holders_of_several_classes_in_one_prompt_are_read_alike() -> None:
    """``decide`` reads ``_masks`` in place where a holder's class keeps it in a slot (found
    once per class), else by name: holders of a subclass with slots of its own, of ``Holders``
    and of a class keeping ``_masks`` as a property, in one prompt's stretches, decide as the
    same stretches held by ``Holders`` alone."""

    class Tagged(Holders):
        __slots__ = ("tag",)

    class Property(Holders):
        @property
        def _masks(self) -> object:  # type: ignore[override]
            return None  # kept nowhere: decide asks masks(fleet), which keeps nothing here

        @_masks.setter
        def _masks(self, value: object) -> None:
            pass

    fleet = Positions(["a", "b", "c", "d"])
    held = [frozenset({("a", "GPU"), ("b", "CPU"), ("c", "GPU")}),
            frozenset({("a", "GPU"), ("c", "DISK")}), frozenset({("a", "CPU")})]  # fmt: skip
    loads = Loads([0, 1, 0, 0], [0, 0, 0, 0], [0.0, 0.0, 0.0, 0.0])
    args = (fleet, loads, (), 200, 16, scoring.LOAD_BOUND, 3, scoring.WEIGHTS, scoring.OTHER_WEIGHT)
    expected = _scoring.decide([(Holders(pairs), 3) for pairs in held], *args)
    for first in (Tagged, Holders, Property):  # each class met first, then the others
        classes = [first, *(c for c in (Tagged, Holders, Property) if c is not first)]
        stretches = [(cls(pairs), 3) for cls, pairs in zip(classes, held, strict=True)]
        for holders, _ in stretches:
            holders.masks(fleet)  # kept where the class keeps them
        assert _scoring.decide(stretches, *args) == expected
        assert _scoring.decide(stretches[::-1], *args) == _scoring.decide(
            [(Holders(pairs), 3) for pairs in held[::-1]], *args
        )
