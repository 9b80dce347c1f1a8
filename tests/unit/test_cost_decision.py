"""The scheduler half decides hits by the costs it measures, as a specification: the engine's
steps timed from its plans, a tier's loads from its reports, and what it decided counted per
tier and named in the request's provenance.

64-token engine blocks, one chunk per block, byte-string hashes, one rank, a disk tier in
tmp_path whose files the test writes as the workers would; a clock the test moves. The engine
computes a step in 2 ms plus 10 us a token.
"""

from __future__ import annotations

from pathlib import Path

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.scheduler.costs.model import MIN_STEPS, PROBE_AFTER_DECLINED, PROBE_AFTER_S
from kvtier.step_plan import JobOutcome, WorkerReport
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path

FINGERPRINT = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 64)
FILE = 100  # bytes of one chunk file
BLOCK = 64  # tokens
PROMPT = [b"p%d" % i for i in range(8)]  # 512 tokens, and one more: 513
BLOCKS = [list(range(20, 29))]


def ms(value: float) -> float:
    return value / 1e3


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _connector(root: Path, clock: Clock) -> SchedulerConnector:
    config = KVTierConfig(cpu_bytes_to_use=1, sections={"disk": DiskConfig(str(root), 64 * FILE)})
    disk = DiskIndex(root, 64 * FILE, 1, FINGERPRINT.digest(), FILE)
    connector = SchedulerConnector(
        config, [GroupSpec(BLOCK)], 0, 1, ChunkKeyMaker(FINGERPRINT, 1), [disk], clock=clock
    )
    for key in connector.keys.keys(PROMPT, 0):  # the prompt's chunks: on disk only
        path = chunk_path(root, key, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(FILE))
    return connector


def _report(connector: SchedulerConnector, job_id: int, seconds: float) -> None:
    connector.on_report(WorkerReport({job_id: JobOutcome(1, bytes=FILE, seconds=seconds)}))


def _engine_computes(connector: SchedulerConnector, clock: Clock) -> int:
    """Request "w" computes a 512-token prompt, then decodes: the engine's steps are timed.
    The tokens it computed."""
    hashes = [b"w%d" % i for i in range(8)]
    assert connector.lookup("w", hashes, 0, 513) == 0
    connector.on_alloc("w", BLOCKS, 0)
    computed = 0
    for step in range(2 * MIN_STEPS):
        new = 512 if step == 0 else 1
        computed += new
        scheduled = ScheduledRequest("w", BLOCKS if step == 0 else None, computed, new, step > 0)
        connector.build_plan([scheduled])
        clock.now += ms(2) + ms(0.01) * new
    assert connector.costs is not None and connector.costs.view() is not None
    return computed


def _hit(connector: SchedulerConnector, req_id: str, seconds: float = 0.0) -> int | None:
    """``req_id`` looks the prompt up and is allocated; its loads take ``seconds`` each."""
    hit = connector.lookup(req_id, PROMPT, 0, 513)
    assert hit is not None
    connector.on_alloc(req_id, BLOCKS, hit)
    for load in connector.build_plan([]).loads:
        _report(connector, load.job_id, seconds)
    return hit


def test_a_tier_measured_slower_than_computing_is_computed_and_counted(tmp_path: Path) -> None:
    clock = Clock()
    connector = _connector(tmp_path, clock)
    _engine_computes(connector, clock)
    for req_id in "a1", "a2", "a3":  # not measured: loaded, 40 us a token each
        assert _hit(connector, req_id, seconds=ms(20)) == 512
    assert _hit(connector, "b") == 0  # 5.1 ms of compute: computed
    disk = connector.stats.tiers["disk"]  # "w" missed, "a*" loaded, "b" computed instead
    assert (disk.hit_chunks, disk.miss_chunks, disk.declined_chunks) == (24, 8, 8)
    assert "disk hit 24/40 chunks (60%)" in connector.stats.log_line()
    assert "computed instead 8" in connector.stats.log_line()
    found = connector.provenance("b", 513)
    assert found is not None and found.declined == {"disk": 512}
    assert found.computed_tokens == 513
    assert found.as_params()["kvtier"]["declined"] == {"disk": 512}  # type: ignore[index]
    connector.check_integrity()


def test_a_tier_judged_too_slow_is_probed_again(tmp_path: Path) -> None:
    clock = Clock()
    connector = _connector(tmp_path, clock)
    _engine_computes(connector, clock)
    for req_id in "a1", "a2", "a3":
        _hit(connector, req_id, seconds=ms(20))
    for n in range(PROBE_AFTER_DECLINED):
        assert _hit(connector, f"declined-{n}") == 0
    assert _hit(connector, "not yet") == 0  # no time since it was measured
    probes = 0
    while _hit(connector, "fast?") == 0:  # it got faster: each probe finds it so
        assert probes < 3, "a tier that got faster was never loaded again"
        for n in range(PROBE_AFTER_DECLINED):
            assert _hit(connector, f"declined-{probes}-{n}") == 0
        clock.now += PROBE_AFTER_S
        assert _hit(connector, f"probe-{probes}", seconds=ms(1)) == 512
        probes += 1
    assert probes == 3  # the third in a row, all fast: a lasting change, taken at once


def test_a_read_longer_than_a_step_makes_the_request_wait(tmp_path: Path) -> None:
    """Read before the forward, 3 ms would stall every running request longer than waiting a
    step (2 ms) costs this one: the request waits for it, and still gains (6.4 ms of compute)."""
    clock = Clock()
    connector = _connector(tmp_path, clock)
    computed = _engine_computes(connector, clock)
    for req_id in "a1", "a2", "a3":
        _hit(connector, req_id, seconds=ms(3))
    connector.build_plan([ScheduledRequest("w", None, computed + 1, 1, True)])  # "w" decodes
    assert connector.lookup("b", PROMPT, 0, 513) == 512
    assert connector.loads_async("b") is True
    connector.on_alloc("b", BLOCKS, 512)
    (load,) = connector.build_plan([]).loads
    assert not load.sync


def test_without_a_clock_the_rules_decide(tmp_path: Path) -> None:
    clock = Clock()
    connector = _connector(tmp_path, clock)
    connector.costs = None  # as built without a clock: the engine-free tests of the rules
    assert _hit(connector, "a", seconds=ms(20)) == 512
    assert _hit(connector, "b") == 512
    assert connector.stats.tiers["disk"].declined_chunks == 0
