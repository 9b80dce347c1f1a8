"""Never wrong, never lost (issue 19): every fault in every tier, against the engine without kvtier.

A seeded campaign (``kvtier.apps.bench.faults.campaign``; the scenario that served wrong KV is
``test_fault_scenario.py``): for disk and Redis tiers x host tiers tiny and roomy x synchronous
and asynchronous reads, one engine runs every fault in turn (bit flips, truncation, another
chunk's record, another model's record, a read error, the tier killed and restarted, the
connector reset mid-load) on all or half of the records, each followed by two or three passes
over prompts sharing prefixes; resets with host memory alone; and a tensor-parallel engine with
faults on rank 1's records only. Every output equals the engine's without kvtier; the passes
after a fault's are served >= 90 % again (or found and computed by the costs' choice: CI once
saw a restarted Redis's 2 chunks of 15 declined as slower than computing on a loaded machine).
``kvtier bench faults`` runs the same world at random.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import PARALLEL_ENV

from kvtier.apps.bench.faults.campaign import Campaign, shared_prefix_prompts
from kvtier.apps.bench.faults.setting import Setting
from kvtier.apps.bench.faults.tiers import Fault


@pytest.fixture(scope="module")
def campaign(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    """6 prompts: 3 prefixes of 200-420 tokens, 2 suffixes each."""
    prompts = shared_prefix_prompts(tiny_model, [200, 300, 420], 2)
    campaign = Campaign(tiny_model, prompts, tmp_path_factory.mktemp("campaign"))
    campaign.reference()
    return campaign


def _run_all(campaign: Campaign, setting: Setting, faults: list[Fault], rank: int | None) -> None:
    """Each fault in turn on one engine, on all then half the records, 2 then 3 passes.

    A tiny host tier (4 chunks) sheds a store when all its slots are pinned by loads and
    writes in flight, counted in ``skipped_stores``: under a loaded machine's slow writes, one
    chunk recomputed after the fault may reach the tier only on the next pass (CI twice saw a
    second pass of 0.833: one shed chunk, 21 skipped stores where 20 are usual). There every
    case has 3 passes and heals within two; every output is right in every pass."""
    rng = random.Random(zlib.crc32(str(setting).encode()))  # seeded: the same run every time
    with campaign.engine(setting) as run:
        for n, fault in enumerate(faults):
            share, passes = (1.0, 2) if n % 2 == 0 else (0.5, 3)
            tiny = setting.host == "tiny"
            case = run.case(fault, rng, share, rank, 3 if tiny else passes)
            assert case.wrong == 0, case
            healed = max if tiny else min
            assert healed(case.passes[1:]) >= 0.9, case  # a failure shows the case's counters
            if fault in DAMAGED_BYTES and case.damaged:  # found bad, counted by the tier
                assert case.counters.get(f"{setting.tier}.bad_chunks", 0) > 0, case


DAMAGED_BYTES = (Fault.FLIP, Fault.TRUNCATE, Fault.SWAP, Fault.FOREIGN)  # records there, but bad

# each host tier size and each read mode once (test_fault_scenario.py crosses all six pairs)
DISK = [Setting("disk", "tiny", "sync"), Setting("disk", "roomy", "async")]


@pytest.mark.parametrize("setting", DISK, ids=str)
def test_every_fault_in_a_disk_tier_is_a_miss_that_heals(
    campaign: Campaign, setting: Setting
) -> None:
    _run_all(campaign, setting, list(Fault), None)


@pytest.fixture
def redis_campaign(campaign: Campaign, fresh_redis: Any) -> Iterator[Campaign]:
    """The campaign with a Redis of its own (a fault kills and restarts it)."""
    campaign.redis = fresh_redis
    yield campaign
    campaign.redis = None


# a network tier is never read before the forward (no engine step waits on it): its loads are
# asynchronous whatever min_async_load_tokens says, and only those long enough are made
REDIS = [Setting("redis", host, "async") for host in ("tiny", "roomy")]


@pytest.mark.parametrize("setting", REDIS, ids=str)
def test_every_fault_in_a_redis_tier_is_a_miss_that_heals(
    redis_campaign: Campaign, setting: Setting
) -> None:
    _run_all(redis_campaign, setting, list(Fault), None)


def test_resets_mid_load_with_host_memory_alone(campaign: Campaign) -> None:
    """The only tier is emptied at every step of a pass: nothing wrong, and once a pass has
    stored the prompts again, the next is served."""
    with campaign.engine(Setting("host", "roomy", "sync")) as run:
        reset = run.case(Fault.RESET, random.Random(0), passes=2)
        after = run.passes(count=1)
        # what the tensor-parallel case compares with: the engine's own outputs computed
        # without reading any cache; on one rank, those of the engine without kvtier
        own = [campaign._generate_served(run.llm, p, False)[0] for p in campaign.prompts]
    assert own == campaign.expected
    assert reset.wrong == after.wrong == 0, (reset, after)
    assert after.passes[0] >= 0.9, after


@pytest.fixture
def tensor_parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in PARALLEL_ENV.items():  # one core per rank, torch.compile off
        monkeypatch.setenv(name, value)


def test_faults_on_one_rank_of_two_are_misses_on_both(
    campaign: Campaign, tensor_parallel: None
) -> None:
    """Rank 1's records only are damaged; the chunk is a miss for the whole engine."""
    faults = [Fault.FLIP, Fault.SWAP, Fault.FOREIGN, Fault.TRUNCATE, Fault.READ_ERROR]
    _run_all(campaign, Setting("disk", "roomy", "sync", ranks=2), faults, rank=1)
