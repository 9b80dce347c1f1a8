"""Prefill→decode in the worker half, on CPU tensors and real loopback sockets: a prefill rank
serves the blocks the plan offers, a decode rank pulls them into its own blocks, and both report
through the engine's calls (``finished``), as vLLM sees them."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import pytest
import torch
from tier_setup import peer_tier

from kvtier.addresses import EngineBlocks
from kvtier.apps.ports import free_ports_on
from kvtier.keys import LayoutFingerprint
from kvtier.step_plan import LoadJob, StepPlan
from kvtier.tiers.peer.config import TransferConfig
from kvtier.tiers.peer.messages import PeerBlocks, PeerOffer
from kvtier.tiers.peer.net import PeerIdentity
from kvtier.tiers.peer.worker import PeerSettings, PeerWorkerTier, peer_worker_tier
from kvtier.worker.connector import WorkerConnector

SECRET = b"worker-peer-test-secret"
IDENTITY = PeerIdentity((("model", "m"), ("tp_rank", "0")))


class Rank(NamedTuple):
    worker: WorkerConnector
    cache: torch.Tensor  # the engine's one layer: 16 blocks of 16 KiB
    address: tuple[str, int] | None  # a prefill rank's listener


def _rank(producer: bool, seed: int) -> Rank:
    worker = WorkerConnector(cpu_bytes_to_use=1 << 20, block_size_factor=1, world_size=1)
    cache = torch.randn(16, 2, 32, 64, generator=torch.Generator().manual_seed(seed))
    worker.register({"layer.0": cache}, [["layer.0"]], num_blocks=16)
    settings = PeerSettings(IDENTITY, SECRET, rank=0, timeout_s=5.0, connections=1)
    assert worker.layout is not None
    tier = peer_worker_tier(worker.layout, settings, producer)
    worker.add_tier(tier)
    return Rank(worker, cache, tier.address)


@pytest.fixture
def pair() -> Iterator[tuple[Rank, Rank]]:
    prefill, decode = _rank(True, seed=1), _rank(False, seed=2)
    yield prefill, decode
    prefill.worker.shutdown()
    decode.worker.shutdown()


def _until(condition: Callable[[], object], timeout_s: float = 10.0) -> object:
    """Step an idle engine (no forward) until ``condition`` answers something true."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, "timed out"
    return found


def _pull(
    address: tuple[str, int] | None,
    remote: list[int],
    local: list[int],
    job: int,
    req: str = "p1",
    decode_req: str = "d1",
) -> LoadJob:
    assert address is not None
    src = PeerBlocks((address,), req, (tuple(remote),))
    return LoadJob(job, decode_req, src, EngineBlocks(np.array(local), (len(local),), (0,)))


def test_offered_blocks_are_pulled_into_the_decode_blocks_then_released(
    pair: tuple[Rank, Rank],
) -> None:
    (prefill, source, address), (decode, destination, _) = pair
    offer = PeerOffer("p1", ((3, 7, 9),), 30.0)
    prefill.begin_step(StepPlan(messages={"peer": [offer]}, held=["p1"], forward=False))
    assert prefill.finished(set())[0] == set()  # held until the decode engine pulled it

    decode.begin_step(StepPlan(loads=[_pull(address, [3, 7, 9], [10, 0, 4], 5)], forward=False))
    decode.start_loads()
    assert _until(lambda: decode.finished(set())[1]) == {"d1"}  # received, not failed
    assert decode.take_failed_blocks() == set()
    for remote, local in ((3, 10), (7, 0), (9, 4)):
        assert torch.equal(destination[local], source[remote])
    assert decode.report().jobs[5].bytes == 3 * source[0].numel() * 4

    prefill.begin_step(StepPlan(forward=False))
    assert _until(lambda: prefill.finished(set())[0]) == {"p1"}  # its blocks may be freed


def test_an_offer_nobody_pulls_is_released_after_its_hold(pair: tuple[Rank, Rank]) -> None:
    prefill = pair[0].worker
    prefill.begin_step(StepPlan(messages={"peer": [PeerOffer("p1", ((3,),), 0.2)]}, held=["p1"]))
    started = time.monotonic()
    assert _until(lambda: prefill.finished(set())[0]) == {"p1"}
    assert time.monotonic() - started < 5


def test_a_pull_from_a_gone_prefill_engine_fails_its_blocks(pair: tuple[Rank, Rank]) -> None:
    (prefill, _, address), decode = pair[0], pair[1].worker
    prefill.shutdown()  # the prefill engine is gone
    decode.begin_step(StepPlan(loads=[_pull(address, [3, 7], [10, 11], 6)], forward=False))
    decode.start_loads()
    started = time.monotonic()
    assert _until(lambda: decode.finished(set())[2]) == {"d1"}  # failed: recomputed
    assert time.monotonic() - started < 10
    assert decode.take_failed_blocks() == {10, 11}
    assert decode.report().jobs[6].failed == 1


def test_a_peer_that_hangs_holds_up_only_its_own_pull(pair: tuple[Rank, Rank]) -> None:
    """A decode rank pulling from two prefill engines: one accepts the connection and never
    answers (a hung process); the other's pull, planned after it, lands long before the hung
    one's 5 s timeout."""
    (prefill, source, address), (decode, destination, _) = pair
    prefill.begin_step(StepPlan(messages={"peer": [PeerOffer("p1", ((3,),), 30.0)]}, forward=False))
    with socket.create_server(("127.0.0.1", 0)) as hung:  # never accepts: the kernel does
        loads = [_pull(hung.getsockname()[:2], [5], [12], 7, decode_req="d1"),
                 _pull(address, [3], [10], 8, decode_req="d2")]  # fmt: skip
        decode.begin_step(StepPlan(loads=loads, forward=False))
        decode.start_loads()
        assert _until(lambda: decode.finished(set())[1], timeout_s=3.0) == {"d2"}
        assert torch.equal(destination[10], source[3])
    # the listener closed: its queued connection is reset, and the pull fails at once
    assert _until(lambda: decode.finished(set())[2], timeout_s=3.0) == {"d1"}
    assert decode.take_failed_blocks() == {12}


def test_nothing_is_left_behind_after_pulls_and_shutdown() -> None:
    """Threads and sockets of both ranks are gone after their shutdown (bounded wait)."""
    threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
    prefill, decode = _rank(True, seed=1), _rank(False, seed=2)
    offers = [PeerOffer(f"p{i}", ((i + 1,),), 30.0) for i in range(3)]
    prefill.worker.begin_step(StepPlan(messages={"peer": offers}, forward=False))
    for i in range(3):
        load = _pull(prefill.address, [i + 1], [i + 4], 10 + i, req=f"p{i}")
        decode.worker.begin_step(StepPlan(loads=[load], forward=False))
        decode.worker.start_loads()
        assert _until(lambda: decode.worker.finished(set())[1]) == {"d1"}
        assert decode.worker.take_failed_blocks() == set()
    prefill.worker.shutdown()
    decode.worker.shutdown()
    _until(lambda: threading.active_count() <= threads)
    _until(lambda: len(os.listdir("/proc/self/fd")) <= fds)


def test_a_release_frees_the_offer_without_a_pull(pair: tuple[Rank, Rank]) -> None:
    (prefill, _, address), decode = pair[0], pair[1].worker
    prefill.begin_step(StepPlan(messages={"peer": [PeerOffer("p1", ((3,),), 30.0)]}, held=["p1"]))
    assert address is not None
    decode.begin_step(
        StepPlan(messages={"peer": [PeerBlocks((address,), "p1", ((),))]}, forward=False)
    )
    assert _until(lambda: prefill.finished(set())[0]) == {"p1"}  # long before its 30 s hold
    assert decode.report().jobs == {}  # a release is no job: nothing for vLLM to wait on


def test_data_parallel_engines_listen_apart_on_a_port_they_share(unused_ports: int) -> None:
    """vLLM's data-parallel engines of one server share its config: with a port given, engine
    d's rank i listens on port + d × ranks + i, not all of them on port + i."""
    config = TransferConfig(secret=SECRET.decode(), port=unused_ports)
    fingerprint = LayoutFingerprint("m", "float32", "", 0, 1, 0, 16)
    engines = []
    try:
        for server_rank in (0, 1):  # rank 0 of engines 0 and 1, one rank each
            worker = WorkerConnector(cpu_bytes_to_use=1 << 20, block_size_factor=1, world_size=1)
            engines.append(worker)
            cache = torch.zeros(16, 2, 32, 64)
            builder = peer_tier(config, "kv_producer", fingerprint, server_rank)
            worker.register({"layer.0": cache}, [["layer.0"]], 16, [builder])
        ports = [_listening_port(worker) for worker in engines]
        assert ports == [unused_ports, unused_ports + 1]
    finally:
        for worker in engines:
            worker.shutdown()


@pytest.fixture
def unused_ports() -> int:
    """The first of two TCP ports in a row free on 127.0.0.1 now."""
    return free_ports_on("127.0.0.1", 2)


def _listening_port(worker: WorkerConnector) -> int:
    (tier,) = [t for t in worker.tiers.values() if isinstance(t, PeerWorkerTier)]
    assert tier.address is not None
    with socket.create_connection(tier.address, timeout=5):  # it accepts
        pass
    return tier.address[1]


def test_a_decode_engine_with_other_weights_pulls_nothing(unused_ports: int) -> None:
    """Engines serving one model path with other weights (``LayoutFingerprint.weights``) are
    refused by each other, as the connector builds them: the pull fails, the blocks are
    recomputed, nothing is written into them."""
    config = TransferConfig(secret=SECRET.decode(), port=unused_ports)
    ranks = []
    for role, weights, seed in (("kv_producer", "a" * 32, 1), ("kv_consumer", "b" * 32, 2)):
        fingerprint = LayoutFingerprint("m", "float32", "", 0, 1, 0, 16, weights=weights)
        worker = WorkerConnector(cpu_bytes_to_use=1 << 20, block_size_factor=1, world_size=1)
        cache = torch.randn(16, 2, 32, 64, generator=torch.Generator().manual_seed(seed))
        builder = peer_tier(config, role, fingerprint)
        worker.register({"layer.0": cache}, [["layer.0"]], 16, [builder])
        ranks.append((worker, cache))
    (prefill, _), (decode, destination) = ranks
    try:
        before = destination.clone()
        prefill.begin_step(StepPlan(messages={"peer": [PeerOffer("p1", ((3,),), 30.0)]}))
        address = ("127.0.0.1", _listening_port(prefill))
        decode.begin_step(StepPlan(loads=[_pull(address, [3], [10], 9)], forward=False))
        decode.start_loads()
        assert _until(lambda: decode.finished(set())[2]) == {"d1"}  # failed: recomputed
        assert decode.take_failed_blocks() == {10}
        assert torch.equal(destination, before)
    finally:
        prefill.shutdown()
        decode.shutdown()
