"""The proxy's prefix index (``kvtier/apps/proxy/prefix_index.py``) and its policies
(``scoring.py``): blocks placed from events by their tokens, runs per engine and tier, and the
engine each policy picks."""

from __future__ import annotations

import msgspec
import pytest
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from kvtier.apps.proxy import scoring
from kvtier.apps.proxy.kv_events import Event, Kind, decode_batch
from kvtier.apps.proxy.positions import Positions
from kvtier.apps.proxy.prefix_index import PrefixIndex, Run
from kvtier.apps.proxy.scoring import Cached, Decision, Loads, choose

BS = 4  # tokens per block
TOKENS = list(range(100, 132))  # eight blocks


def _stored(hashes: list[int], first: int, medium: str = "GPU", parent: int | None = None) -> Event:
    """Blocks ``first..`` of TOKENS, under the engine's ``hashes``."""
    tokens = tuple(TOKENS[first * BS : (first + len(hashes)) * BS])
    return Event(Kind.STORED, tuple(hashes), parent, tokens, BS, medium)


def test_vllms_batches_decode_by_field_name_old_and_new_unknown_fields_ignored() -> None:
    stored = BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=TOKENS[:8],
                         block_size=BS, lora_id=None, medium="CPU", lora_name=None,
                         session_id="s")  # fmt: skip
    batch = KVEventBatch(ts=1.0, events=[stored, BlockRemoved(block_hashes=[2], medium=None),
                                         AllBlocksCleared()])  # fmt: skip
    events = decode_batch(msgspec.msgpack.encode(batch))
    assert events == [
        Event(Kind.STORED, (1, 2), None, tuple(TOKENS[:8]), BS, "CPU"),
        Event(Kind.REMOVED, (2,), medium="GPU"),  # None: the engine's own memory
        Event(Kind.CLEARED),
    ]
    positional = [1.0, [["BlockStored", [7], 3, TOKENS[:4], BS, None, "DISK"],
                        {"type": "SomethingNew", "x": 1},
                        {"type": "BlockRemoved", "block_hashes": [7], "medium": "DISK",
                         "new_field": [1, 2]}], None]  # fmt: skip
    assert decode_batch(msgspec.msgpack.encode(positional)) == [
        Event(Kind.STORED, (7,), 3, tuple(TOKENS[:4]), BS, "DISK"),
        Event(Kind.REMOVED, (7,), medium="DISK"),
    ]
    for bad in (b"\xc1", msgspec.msgpack.encode(5), msgspec.msgpack.encode([1.0, 3])):
        with pytest.raises(ValueError):
            decode_batch(bad)


def test_engines_hashing_alike_tokens_with_other_seeds_meet_in_one_index() -> None:
    index = PrefixIndex()
    # engine a: two blocks in its memory, then a chunk of two in host memory
    assert index.apply("a", [_stored([11], 0), _stored([12], 1, parent=11)]) == 0
    assert index.apply("a", [_stored([13, 14], 2, "CPU", parent=12)]) == 0
    # engine b hashes with another seed: the same tokens meet under one digest
    assert index.apply("b", [_stored([91, 92], 0, "DISK")]) == 0
    digests = index.digests(TOKENS)
    assert len(digests) == 8 and len(index) == 4
    runs = index.runs(digests, ["a", "b", "c"])
    assert runs["a"] == Run({"GPU": 2, "CPU": 2})
    assert runs["b"] == Run({"DISK": 2})
    assert runs["c"].total == 0


def test_digests_tell_prefixes_apart_by_order_and_chain_from_any_block() -> None:
    index = PrefixIndex()
    index.apply("a", [_stored([11], 0)])  # the block size is known from the first event
    a, b = TOKENS[:BS], TOKENS[BS : 2 * BS]
    assert index.digests(a + b)[1] != index.digests(b + a)[1]  # the same blocks, reordered
    assert index.digests(a + a)[1] != index.digests(a)[0]  # a repeated block: a longer prefix
    assert len(set(index.digests(a * 8))) == 8
    assert index.digests(TOKENS + [1, 2]) == index.digests(TOKENS)  # whole blocks only
    # a chunk told with its parent lands where the prompt's own digests do
    index.apply("a", [_stored([12, 13, 14], 1, "CPU", parent=11)])
    assert index.runs(index.digests(TOKENS), ["a"])["a"] == Run({"GPU": 1, "CPU": 3})
    assert index.prompt_runs(TOKENS, ["a"])["a"] == Run({"GPU": 1, "CPU": 3})


def test_runs_follow_groups_of_engines_alike_not_each_engine() -> None:
    index = PrefixIndex()
    for engine in "abcd":  # four of six hold the first two blocks (a system prompt)
        index.apply(engine, [_stored([1, 2], 0)])
    index.apply("b", [_stored([3, 4], 2, "CPU", parent=2)])  # b, its conversation in host memory
    runs = index.runs(index.digests(TOKENS), "abcdef")
    assert runs.common == Run({"GPU": 2})  # the most: a, c, d
    assert sorted((sorted(engines), run) for run, engines in runs.apart) == [
        (["b"], Run({"GPU": 2, "CPU": 2})),
        (["e", "f"], Run()),
    ]
    assert runs["b"].total == 4 and runs["e"] == Run() and runs["d"] == Run({"GPU": 2})


def test_removals_clears_unknown_parents_and_a_dropped_engine() -> None:
    index = PrefixIndex()
    index.apply("a", [_stored([11, 12], 0), _stored([11, 12], 0, "CPU")])
    assert index.apply("a", [_stored([14], 3, parent=13)]) == 1  # its parent was never told
    assert index.unplaced == 1
    index.apply("a", [Event(Kind.REMOVED, (12,), medium="GPU")])
    assert index.runs(index.digests(TOKENS), ["a"])["a"] == Run({"GPU": 1, "CPU": 1})
    index.apply("a", [Event(Kind.CLEARED)])  # the engine's own memory: host memory stays
    assert index.runs(index.digests(TOKENS), ["a"])["a"] == Run({"CPU": 2})
    index.drop("a")
    assert len(index) == 0 and index.hashes("a") == 0


def test_a_shared_tier_serves_every_engine_and_memory_is_bounded() -> None:
    index = PrefixIndex(max_blocks=3)
    index.apply("a", [_stored([1, 2], 0, "REDIS")])
    assert index.runs(index.digests(TOKENS), ["a", "b"])["b"] == Run({"REDIS": 2})
    index.apply("a", [_stored([3, 4], 2, "CPU", parent=2)])  # four hashes: the oldest forgotten
    assert index.hashes("a") == 3
    assert index.runs(index.digests(TOKENS), ["b"])["b"].total == 0  # block 0 is gone


def test_a_hash_is_forgotten_once_its_engine_holds_the_block_in_no_tier() -> None:
    index = PrefixIndex()
    index.apply("a", [_stored([1, 2], 0), _stored([1, 2], 0, "CPU")])
    index.apply("a", [Event(Kind.REMOVED, (1, 2), medium="GPU")])  # still in host memory
    assert index.hashes("a") == 2
    index.apply("a", [Event(Kind.REMOVED, (2,), medium="CPU")])
    assert index.hashes("a") == 1 and len(index) == 1
    index.apply("a", [_stored([3], 1, parent=1), Event(Kind.CLEARED)])  # block 1: GPU only
    assert index.hashes("a") == 1  # block 0 stays: its host copy
    assert index.runs(index.digests(TOKENS), ["a"])["a"] == Run({"CPU": 1})


def _loads(in_flight: list[int], queued: list[int] | None = None,
           recent: list[float] | None = None) -> Loads:  # fmt: skip
    n = len(in_flight)
    return Loads(in_flight, queued or [0] * n, recent or [0.0] * n)


def test_kv_aware_weighs_the_cached_prefix_against_the_queue() -> None:
    near = Cached(Run(), [(Run({"CPU": 6}), [1])])  # engine 1 holds 6 blocks, engine 0 nothing
    decision = choose("kv-aware", _loads([0, 0]), 32, BS, 0, near)
    assert (decision.index, decision.reason, decision.cached_tokens) == (1, "prefix", 24)
    busy = _loads([0, 0], queued=[0, 100])  # its queue outweighs the prefix
    assert choose("kv-aware", busy, 32, BS, 0, near).index == 0
    nothing = Cached(Run({"GPU": 8}), blind=[0, 1])  # no exact index: by load
    assert choose("kv-aware", _loads([1, 0]), 32, BS, 0, nothing) == Decision(1, "no-index", 0)
    assert choose("kv-aware", _loads([1, 0]), 32, BS, 0, None) == Decision(1, "no-index", 0)
    whole = Cached(Run({"CPU": 8}))  # the last token is always computed
    assert choose("kv-aware", _loads([0]), 32, BS, 0, whole).cached_tokens == 31
    # the rest's run, most engines': engine 2 holds nothing (it is blind), 1 holds more
    rest = Cached(Run({"GPU": 2}), [(Run({"GPU": 4}), [1])], blind=[2])
    assert choose("kv-aware", _loads([0, 0, 0]), 32, BS, 0, rest) == Decision(1, "prefix", 16)
    assert choose("kv-aware", _loads([0, 0, 0], [0, 9, 0]), 32, BS, 0, rest).index == 0


def test_a_new_conversation_goes_to_the_engine_sent_fewest_lately() -> None:
    # both hold the shared system prompt only: the one sent fewer requests lately, not the
    # one with the shorter queue (conversations spread evenly, then stay where they are)
    loads = _loads([1, 0], queued=[50, 0], recent=[3.0, 5.0])
    system = Cached(Run({"GPU": 2}))
    assert choose("kv-aware", loads, 32, BS, 1, system) == Decision(0, "load", 8)


def test_least_loaded_and_round_robin() -> None:
    loads = _loads([2, 1, 1])
    assert choose("least-loaded", loads, 32, BS, turn=0).index == 1
    assert choose("least-loaded", loads, 32, BS, turn=2).index == 2  # a tie: whose turn
    assert [choose("round-robin", loads, 32, BS, t).index for t in range(4)] == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="policy must be one of"):
        choose("random", loads, 32, BS, 0)
    with pytest.raises(ValueError, match="no engine"):
        choose("kv-aware", _loads([]), 32, BS, 0)


def test_a_groups_positions_are_made_once_for_a_fleet() -> None:
    fleet, group = Positions(["a", "b", "c"]), frozenset({"c", "a"})
    first = fleet.of(group)
    assert first == [0, 2] and fleet.of(frozenset({"a", "c"})) is first
    assert Positions(["b", "c", "a"]).of(group) == [1, 2]  # another fleet, its own order
    with pytest.raises(KeyError):
        Positions(["b", "c"]).of(group)  # "a" is not of it: its groups are not asked


def test_holders_made_after_a_decision_have_their_masks_for_its_fleet_at_once() -> None:
    """A way of holding that events make once a fleet was decided over has its masks made as
    the events are applied, not when a request meets it (a Python call in the decision)."""
    index, fleet = PrefixIndex(), Positions(["a", "b"])
    index.apply("a", [_stored([1, 2], 0)])
    ((before, _),) = index.prompt_stretches(TOKENS, fleet)
    assert before._masks is None  # made before any fleet was known: made when first asked
    index.apply("b", [_stored([7, 8, 9], 0, medium="CPU")])  # a new way: a in GPU, b in CPU
    both, only_b = (held for held, _ in index.prompt_stretches(TOKENS))
    assert both._masks is not None and only_b._masks is not None
    assert both._masks[:2] == (fleet, ((("GPU", 0b01), ("CPU", 0b10)), 0b11, None))
    assert only_b._masks[:2] == (fleet, ((("CPU", 0b10),), 0b10, None))
    assert both.masks(fleet) is both._masks[1]
    if scoring._scoring is not None:  # and packed, as the compiled decision reads them
        assert both._masks[2] == scoring._scoring.pack(both._masks[1], len(fleet))
