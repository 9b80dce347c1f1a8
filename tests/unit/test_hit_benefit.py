"""A hit decided by its measured costs (``kvtier/scheduler/hit_benefit.py``): what it loads is
what is predicted cheaper than computing it, and it stays a prefix of the run.

64-token chunks; the engine computes a prompt token in 10 us; a load that makes the request wait
costs it 0.5 ms more than its reads. A run is written as where each tier's part ends, in chunks:
host memory, then the chain (``disk`` is read before the forward, ``redis`` never is).
"""

from __future__ import annotations

from kvtier.scheduler.costs import CostView, Line
from kvtier.scheduler.hit import HitRun
from kvtier.scheduler.hit_policy import Declined, Hit, HitPolicy, HitRequest, choose_hit

US = 1e-6
COMPUTE = 10 * US  # seconds per prompt token
WAIT = 500 * US
POLICY = HitPolicy(chunk_tokens=64, sync_capable=True, min_async_load_tokens=None)
FAST = Line(50 * US, 0.5 * US)  # a tier twenty times cheaper per token than computing
SLOW = Line(100 * US, 40 * US)  # four times dearer
MEMCPY = Line(10 * US, 0.05 * US)  # host memory on the CPU: a copy


def _costs(**tiers: Line) -> CostView:
    return CostView(COMPUTE, WAIT, tiers)


def _run(host: int, *chain: tuple[str, int], pending: bool = False, retry: bool = False) -> HitRun:
    """A run from chunk 0: ``host`` chunks in host memory, then each chain tier's part."""
    end = chain[-1][1] if chain else host
    sync_end = host
    for tier, stop in chain:
        if tier != "disk":
            break
        sync_end = stop
    return HitRun(host, end, retry, sync_end, pending, tuple(chain))


def _request(num_tokens: int, full: int) -> HitRequest:
    return HitRequest(num_computed_tokens=0, num_tokens=num_tokens, first=0, full=full)


def test_a_tier_slower_than_computing_is_computed() -> None:
    run = _run(0, ("disk", 8))  # 512 tokens, all on a slow disk
    hit = choose_hit(run, _request(513, 8), POLICY, False, _costs(disk=SLOW))
    assert hit == Hit(0, declined=(Declined("disk", 8, 512),))


def test_a_tier_faster_than_computing_is_loaded() -> None:
    run = _run(0, ("disk", 8))
    hit = choose_hit(run, _request(513, 8), POLICY, False, _costs(disk=FAST))
    assert hit == Hit(512, load_async=False, tiers=("disk",))


def test_a_tier_not_measured_yet_is_loaded_so_that_it_is() -> None:
    run = _run(0, ("redis", 8))
    hit = choose_hit(run, _request(513, 8), POLICY, False, _costs())
    assert hit == Hit(512, load_async=True, tiers=("redis",))  # a network tier: it waits


def test_a_mixed_run_loads_the_prefix_worth_most() -> None:
    """Host memory and a fast disk load; the slow Redis part after them is computed."""
    run = _run(3, ("disk", 5), ("redis", 8))
    hit = choose_hit(run, _request(600, 9), POLICY, False, _costs(disk=FAST, redis=SLOW))
    assert hit == Hit(320, False, ("cpu", "disk"), (Declined("redis", 3, 192),))


def test_a_host_hit_is_never_dropped_while_a_copy_is_cheaper() -> None:
    run = _run(8)
    slow_engine = CostView(0.1 * US, WAIT, {"cpu": MEMCPY})  # even a very fast engine
    assert choose_hit(run, _request(513, 8), POLICY, False, slow_engine) == Hit(512, tiers=("cpu",))


def test_the_redis_example_loads_a_short_redis_run_when_cheaper() -> None:
    """A 321-token prompt whose shared prefix (3 chunks) is in host memory and whose own 2
    chunks Redis holds: the rules computed the Redis part (128 tokens, under
    min_async_load_tokens); the costs load it while Redis is cheap, and not when it is slow."""
    run, request = _run(3, ("redis", 5)), _request(321, 5)
    by_rules = choose_hit(run, request, POLICY._replace(min_async_load_tokens=256), False)
    assert by_rules == Hit(192)
    cheap = choose_hit(run, request, POLICY, False, _costs(cpu=MEMCPY, redis=FAST))
    assert cheap == Hit(320, load_async=True, tiers=("cpu", "redis"))
    slow = choose_hit(run, request, POLICY, False, _costs(cpu=MEMCPY, redis=SLOW))
    assert slow == Hit(192, False, ("cpu",), (Declined("redis", 2, 128),))


def test_a_short_network_run_is_not_worth_a_wait() -> None:
    """One Redis chunk saves 0.8 ms of compute (with the margin), less than a wait costs."""
    costs = CostView(COMPUTE, 2e-3, {"redis": FAST})
    run = _run(3, ("redis", 4))
    hit = choose_hit(run, _request(321, 5), POLICY, False, costs)
    assert hit == Hit(192, False, ("cpu",), (Declined("redis", 1, 64),))


def test_several_groups_always_wait_and_only_for_a_load_worth_it() -> None:
    policy = POLICY._replace(sync_capable=False)
    costs = CostView(COMPUTE, 2e-3, {})
    assert choose_hit(_run(8), _request(513, 8), policy, False, costs) == Hit(512, True, ("cpu",))
    short = choose_hit(_run(1), _request(513, 8), policy, False, costs)  # 64 tokens: 0.8 ms
    assert short == Hit(0, declined=(Declined("cpu", 1, 64),))


def test_a_long_fast_disk_read_waits_rather_than_stall_the_step() -> None:
    """Read before the forward, a read stalls every running request; it is made so only when
    it is shorter than what waiting would cost this request."""
    slowish = Line(0.0, 2 * US)  # 1 ms for 512 tokens: more than a wait
    hit = choose_hit(_run(0, ("disk", 8)), _request(513, 8), POLICY, False, _costs(disk=slowish))
    assert hit == Hit(512, load_async=True, tiers=("disk",))
    short = choose_hit(_run(6, ("disk", 8)), _request(513, 8), POLICY, False, _costs(disk=slowish))
    assert short == Hit(512, load_async=False, tiers=("cpu", "disk"))  # 128 tokens: 0.26 ms


def test_the_hit_stops_before_the_last_token_and_the_tail_follows_a_full_run() -> None:
    costs = _costs(cpu=MEMCPY)
    assert choose_hit(_run(4), _request(256, 4), POLICY, False, costs).tokens == 255
    assert choose_hit(_run(4), _request(300, 4), POLICY, True, costs).tokens == 299  # the tail


def test_a_remote_lookup_in_flight_is_waited_for_only_when_it_could_pay() -> None:
    """Asked again next step, the request waits a step: worth it for 832 more tokens (10.4 ms
    of compute), not for 64 (0.8 ms) when a wait costs 2 ms."""
    costs = CostView(COMPUTE, 2e-3, {"cpu": MEMCPY})
    pending = _run(3, pending=True)
    assert choose_hit(pending, _request(1025, 16), POLICY, False, costs) == Hit(None)
    assert choose_hit(pending, _request(257, 4), POLICY, False, costs).tokens == 192


def test_a_store_in_flight_is_waited_for_only_when_it_could_pay() -> None:
    costs = CostView(COMPUTE, 2e-3, {"cpu": MEMCPY})
    assert choose_hit(_run(0, retry=True), _request(1025, 16), POLICY, False, costs) == Hit(None)
    assert choose_hit(_run(0, retry=True), _request(100, 1), POLICY, False, costs) == Hit(0)


def test_with_min_async_load_tokens_set_the_rules_decide_how_and_the_costs_only_decline() -> None:
    """Set to 1 (every read from the chain makes the request wait), a one-chunk disk part is
    waited for though a wait costs more than computing it (unset, the costs read it before the
    forward); a disk slower than computing is still computed."""
    policy = POLICY._replace(min_async_load_tokens=1)
    costs = CostView(COMPUTE, 2e-3, {"disk": FAST})
    run, request = _run(3, ("disk", 4)), _request(293, 4)
    assert choose_hit(run, request, policy, False, costs) == Hit(256, True, ("cpu", "disk"))
    unset = choose_hit(run, request, POLICY, False, costs)  # the costs: a short read, no wait
    assert unset == Hit(256, False, ("cpu", "disk"))
    slow = CostView(COMPUTE, 2e-3, {"disk": SLOW})
    hit = choose_hit(run, request, policy, False, slow)
    assert hit == Hit(192, False, ("cpu",), (Declined("disk", 1, 64),))
