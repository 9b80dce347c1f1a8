"""Prefill→decode in the scheduler half: what a prefill engine offers and holds, what a decode
engine pulls into which blocks (4-token blocks, one chunk per block, two worker ranks)."""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.config import KVTierConfig
from kvtier.keys import SALT_BYTES, ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import JobOutcome, WorkerReport
from kvtier.tiers.peer.messages import PeerBlocks
from kvtier.tiers.peer.planner import PeerPlanner
from kvtier.tiers.peer.roles import PeerConsumer, PeerProducer

HASHES = [b"h0", b"h1", b"h2"]  # three full blocks: 12 tokens


def _connector(producer: bool) -> SchedulerConnector:
    fingerprint = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
    peer: dict[str, Any] = {}
    if producer:
        peer["producer"] = PeerProducer("prefill-0", hold_s=5.0, tp_size=2, world_size=2)
        peer["producer"].set_endpoints({0: ("127.0.0.1", 5000), 1: ("127.0.0.1", 6000)})
    else:
        peer["consumer"] = PeerConsumer(block_tokens=4, num_groups=1, tp_size=2, world_size=2)
    config = KVTierConfig(cpu_bytes_to_use=1)
    connector = SchedulerConnector(config, [GroupSpec(4)], 8, 2, ChunkKeyMaker(fingerprint, 1))
    connector.add_source(PeerPlanner(**peer))
    return connector


def _peer(connector: SchedulerConnector) -> PeerPlanner:
    """The connector's peer tier (a request source)."""
    planner = connector.sources.by_name["peer"]
    assert isinstance(planner, PeerPlanner)
    return planner


def _prefilled(req: str = "p1") -> tuple[SchedulerConnector, dict[str, Any]]:
    """A prefill engine that ran ``req`` (14 tokens in blocks 7, 8, 9, 3) to its end."""
    connector = _connector(producer=True)
    assert connector.lookup(req, HASHES, 0, 14, [1, 2]) == 0
    connector.on_alloc(req, [[7, 8, 9, 3]], 0)
    stores = connector.build_plan([ScheduledRequest(req, [[7, 8, 9, 3]], 14)]).stores
    connector.on_report(WorkerReport({job.job_id: JobOutcome(ranks=2) for job in stores}))
    params = _peer(connector).finished(req, {"do_remote_decode": True}, [[7, 8, 9, 3]], 14, True)
    assert params is not None
    return connector, params


def test_a_finished_prefill_request_is_offered_with_nixl_field_names() -> None:
    connector, params = _prefilled()
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_block_ids"] == [[7, 8, 9, 3]]
    assert params["remote_engine_id"] == "prefill-0" and params["remote_request_id"] == "p1"
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", 5000)
    assert params["remote_ports"] == [5000, 6000] and params["tp_size"] == 2
    assert params["remote_num_tokens"] == 14

    assert connector.request_finished("p1") is True  # blocks held for the decode engine
    plan = connector.build_plan([])
    assert [(o.req_id, o.block_ids, o.hold_s) for o in plan.messages["peer"]] == [
        ("p1", ((7, 8, 9, 3),), 5)
    ]
    assert "p1" in plan.held
    assert connector.has_pending_work  # the engine keeps stepping until the workers release it
    _peer(connector).released({"p1"})
    assert not connector.has_pending_work


@pytest.mark.parametrize(
    ("params", "completed"),
    [
        (None, True),
        ({}, True),
        ({"do_remote_decode": False}, True),
        ({"do_remote_decode": True}, False),
    ],
)
def test_only_a_completed_request_asking_for_remote_decode_is_offered(
    params: dict[str, Any] | None, completed: bool
) -> None:
    connector = _connector(producer=True)
    assert _peer(connector).finished("p", params, [[1, 2]], 8, completed) is None
    assert connector.request_finished("p") is False
    assert "peer" not in connector.build_plan([]).messages


def test_a_decode_request_pulls_its_prompt_past_its_own_hit_into_its_blocks() -> None:
    _, params = _prefilled()
    decode = _connector(producer=False)
    # the engine has the first block itself: 10 of 14 tokens are pulled, asynchronously
    assert decode.source_lookup("peer", "d1", HASHES, params, 14, 4) == 10
    # one block: worth a pull
    assert decode.source_lookup("peer", "d2", HASHES, params, 14, 10) == 4
    decode.on_alloc("d1", [[40, 41, 42, 43]], 10)
    (load,) = decode.build_plan([]).loads
    assert isinstance(load.src, PeerBlocks) and not load.sync
    assert load.src.endpoints == (("127.0.0.1", 5000), ("127.0.0.1", 6000))
    assert load.src.req_id == "p1" and load.src.block_ids == ((8, 9, 3),)
    assert load.dst.block_ids.tolist() == [41, 42, 43] and load.dst.group_sizes == (3,)
    assert decode.requests["d1"].loaded_tokens == {"peer": 10}
    # the pulled prompt is not stored again here (the prefill engine has it): no store job
    # on the request's first step, which would delay its first token
    assert decode.build_plan([ScheduledRequest("d1", [[40, 41, 42, 43]], 14)]).stores == []

    decode.on_report(WorkerReport({load.job_id: JobOutcome(ranks=2, bytes=300, seconds=0.01)}))
    peer = decode.stats.tiers["peer"]
    assert (peer.loaded_chunks, peer.loaded_bytes, peer.failed_loads) == (3, 300, 0)
    provenance = decode.provenance("d1", 14)
    assert provenance is not None and provenance.tiers["peer"] == 10


def test_a_decode_request_of_an_adapter_stores_its_own_chunks_under_its_salt() -> None:
    # a LoRA request's later chunks (its output past the pulled prompt) are keyed as its own
    # lookups find them, with its adapter's salt (unsalted, no lookup of it would load them)
    _, params = _prefilled()
    decode, salt = _connector(producer=False), b"a" * SALT_BYTES
    hashes = list(HASHES)  # the engine's list, growing as the request decodes
    assert decode.source_lookup("peer", "d1", hashes, params, 14, 0, salt) == 14
    decode.on_alloc("d1", [[40, 41, 42, 43]], 14)
    (load,) = decode.build_plan([]).loads
    decode.on_report(WorkerReport({load.job_id: JobOutcome(ranks=2, bytes=300)}))
    hashes.append(b"h3")  # two tokens decoded: its fourth block is full
    (store,) = decode.build_plan([ScheduledRequest("d1", [[40, 41, 42, 43]], 16)]).stores
    assert store.keys == tuple(decode.keys.keys([b"h3"], 0, salt=salt))
    assert store.keys != tuple(decode.keys.keys([b"h3"], 0))


def test_a_failed_pull_is_counted_and_named_in_the_provenance() -> None:
    _, params = _prefilled()
    decode = _connector(producer=False)
    assert decode.source_lookup("peer", "d1", HASHES, params, 14, 0) == 14
    decode.on_alloc("d1", [[40, 41, 42, 43]], 14)
    (load,) = decode.build_plan([]).loads
    decode.on_report(WorkerReport({load.job_id: JobOutcome(ranks=2, failed=1)}))
    assert decode.stats.tiers["peer"].failed_loads == 1
    provenance = decode.provenance("d1", 14)
    assert provenance is not None and provenance.failed_tokens == 14


@pytest.mark.parametrize(
    "change",
    [
        {"do_remote_prefill": False},
        {"remote_host": None},
        {"tp_size": 4},  # another tensor-parallel layout: the shards do not match
        {"remote_block_ids": [[1], [2]]},  # two groups for this engine's one
        {"remote_ports": [5000]},  # one rank for this engine's two
        {"remote_block_ids": "7,8"},
    ],
)
def test_params_a_decode_engine_cannot_pull_are_computed(change: dict[str, Any]) -> None:
    _, params = _prefilled()
    decode = _connector(producer=False)
    assert decode.source_lookup("peer", "d1", HASHES, {**params, **change}, 14, 0) == 0
    assert "d1" not in decode.requests


def test_nixl_style_params_without_per_rank_ports_use_port_plus_rank() -> None:
    _, params = _prefilled()
    del params["remote_ports"], params["remote_hosts"]
    decode = _connector(producer=False)
    flat = {**params, "remote_block_ids": [7, 8, 9, 3]}
    assert decode.source_lookup("peer", "d1", HASHES, flat, 14, 0)
    decode.on_alloc("d1", [[40, 41, 42, 43]], 14)
    (load,) = decode.build_plan([]).loads
    assert isinstance(load.src, PeerBlocks)
    assert load.src.endpoints == (("127.0.0.1", 5000), ("127.0.0.1", 5001))


@pytest.mark.parametrize("own_hit", [14, 13, 12, 11])
def test_a_decode_request_that_pulls_nothing_frees_the_offer_at_once(own_hit: int) -> None:
    _, params = _prefilled()
    decode = _connector(producer=False)
    # its own prefix cache holds the prompt but for less than a block (4 tokens): those few are
    # computed with the last one, not worth a step's wait; the offer is released
    assert decode.source_lookup("peer", "d1", HASHES, params, 14, own_hit) == 0
    assert "d1" not in decode.requests  # a request like any other: nothing waits for a pull
    assert _peer(decode).release(params) is True
    (release,) = decode.build_plan([]).messages["peer"]
    assert release.req_id == "p1" and release.block_ids == ((),)
    assert release.endpoints == (("127.0.0.1", 5000), ("127.0.0.1", 6000))
    # params that name no pull release nothing
    assert _peer(decode).release({"do_remote_prefill": True}) is False
    assert _peer(decode).release(None) is False
    assert "peer" not in decode.build_plan([]).messages


def test_a_pull_the_engine_takes_none_of_is_no_load_and_frees_the_offer() -> None:
    # vLLM 0.34 discards a connector's hit for a request with prompt logprobs, after the lookup:
    # the request runs at once, computing its whole prompt; a load of nothing would report it
    # received, and the scheduler asserts a received request is waiting for it
    _, params = _prefilled()
    decode = _connector(producer=False)
    assert decode.source_lookup("peer", "d1", HASHES, params, 14, 0) == 14
    decode.on_alloc("d1", [[40, 41, 42, 43]], 0)
    plan = decode.build_plan([ScheduledRequest("d1", [[40, 41, 42, 43]], 0)])
    assert plan.loads == []
    (release,) = plan.messages["peer"]
    assert release.req_id == "p1"


def _sliding_params(window_group: list[int]) -> dict[str, Any]:
    """A 14-token prompt (blocks of 4) offered in two groups: full attention, then a sliding
    window of 8 tokens whose leading blocks the prefill engine freed (``NULL_BLOCK``, 0)."""
    return {"do_remote_prefill": True, "remote_engine_id": "p", "remote_request_id": "r",
            "remote_block_ids": [[1, 2, 3, 4], window_group], "remote_host": "127.0.0.1",
            "remote_port": 5000, "remote_num_tokens": 14, "tp_size": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("window_group", "own_hit", "pulled"),
    [
        ([0, 6, 7, 8], 0, 14),  # token 13 attends to 6..13: blocks 1-3, all there
        ([0, 0, 7, 8], 0, 0),  # block 1 (tokens 4-7) freed: computed here, not pulled
        ([0, 0, 7, 8], 8, 6),  # ... unless this engine's own hit holds it
        ([9, 6, 7, 8], 0, 14),
    ],
)
def test_a_sliding_window_block_the_last_token_needs_but_the_prefill_freed_is_not_pulled(
    window_group: list[int], own_hit: int, pulled: int
) -> None:
    consumer = PeerConsumer(block_tokens=4, num_groups=2, tp_size=1, world_size=1,
                            windows=(None, 8))  # fmt: skip
    assert consumer.lookup(_sliding_params(window_group), 14, own_hit) == pulled


def test_a_full_attention_consumer_ignores_leading_null_blocks_and_windows_must_match_groups() -> (
    None
):
    consumer = PeerConsumer(block_tokens=4, num_groups=2, tp_size=1, world_size=1)
    assert consumer.lookup(_sliding_params([0, 0, 7, 8]), 14, 0) == 14
    with pytest.raises(ValueError, match="1 sliding windows for 2 groups"):
        PeerConsumer(block_tokens=4, num_groups=2, tp_size=1, world_size=1, windows=(8,))


@pytest.mark.parametrize(
    ("windows", "prompt_tokens", "backoff"),
    [
        ((None, 8), 14, 0),  # the next token's window starts at 7: block 1 (4-7) is kept
        ((None, 8), 15, 1),  # ... starts at 8: block 1 would go, token 14 attends to 7
        ((None, 8), 19, 1),
        ((None, 8), 5, 0),  # shorter than the window: nothing is freed
        ((None,), 15, 0),  # full attention keeps every block
    ],
)
def test_a_prefill_backs_off_the_last_token_when_its_window_would_drop_a_needed_block(
    windows: tuple[int | None, ...], prompt_tokens: int, backoff: int
) -> None:
    producer = PeerProducer("p", 5.0, 1, 1, block_tokens=4, windows=windows)
    assert producer.backoff(prompt_tokens) == backoff
    if backoff:  # backed off, the decode engine finds every block it needs
        consumer = PeerConsumer(block_tokens=4, num_groups=2, tp_size=1, world_size=1,
                                windows=(None, 8))  # fmt: skip
        kept = [0] * ((prompt_tokens - 1 - 8 + 1) // 4)  # what the prefill frees at n - 1
        blocks = -(-(prompt_tokens - 1) // 4)
        params = _sliding_params(kept + list(range(10, 10 + blocks - len(kept))))
        params["remote_block_ids"][0] = list(range(1, blocks + 1))
        params["remote_num_tokens"] = prompt_tokens - 1
        assert consumer.lookup(params, prompt_tokens, 0) == prompt_tokens - 1
