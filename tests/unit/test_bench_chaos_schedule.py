"""``kvtier bench chaos``'s faults: drawn from the seed, one at a time after a quiet gap, every
kind in each round, each on a target its kind may have."""

from __future__ import annotations

import pytest

from kvtier.apps.bench.chaos.schedule import FaultKind, plan, targets
from kvtier.apps.bench.chaos.settings import ChaosSettings


def test_the_same_seed_plans_the_same_faults_and_another_seed_others() -> None:
    settings = ChaosSettings(minutes=10, seed=3)
    assert plan(settings) == plan(ChaosSettings(minutes=10, seed=3))
    assert plan(settings) != plan(ChaosSettings(minutes=10, seed=4))


def test_each_round_holds_every_kind_once_and_the_gaps_outlast_the_run() -> None:
    settings = ChaosSettings(minutes=10, gap_s=(30.0, 40.0))
    planned = plan(settings)
    kinds = len(FaultKind)
    assert len(planned) % kinds == 0
    for start in range(0, len(planned), kinds):
        assert {f.kind for f in planned[start : start + kinds]} == set(FaultKind)
    assert all(30.0 <= f.gap_s <= 40.0 for f in planned)
    assert sum(f.gap_s for f in planned) >= settings.duration_s


def test_the_short_form_plans_every_kind_once() -> None:
    planned = plan(ChaosSettings.quick(seed=1))
    assert sorted(f.kind for f in planned) == sorted(FaultKind)
    assert all(4.0 <= f.gap_s <= 8.0 for f in planned)


def test_stops_hold_their_drawn_length_and_the_other_kinds_none() -> None:
    settings = ChaosSettings(minutes=10, engine_stop_s=(5.0, 20.0), redis_stop_s=(2.0, 5.0))
    for fault in plan(settings):
        if fault.kind is FaultKind.ENGINE_STOP:
            assert 5.0 <= fault.hold_s <= 20.0
        elif fault.kind is FaultKind.REDIS_STOP:
            assert 2.0 <= fault.hold_s <= 5.0
        else:
            assert fault.hold_s == 0.0


def test_engines_are_killed_or_stopped_the_prefill_engine_too_but_only_the_fleet_reset() -> None:
    found = targets(engines=2, pd=True)
    assert found[FaultKind.ENGINE_KILL] == ("engine-0", "engine-1", "prefill")
    assert found[FaultKind.ENGINE_STOP] == ("engine-0", "engine-1", "prefill")
    assert found[FaultKind.HOST_RESET] == ("engine-0", "engine-1")
    assert found[FaultKind.REDIS_KILL] == found[FaultKind.REDIS_STOP] == ("redis",)
    assert found[FaultKind.PROXY_RESTART] == ("proxy",)
    assert targets(engines=1, pd=False)[FaultKind.ENGINE_KILL] == ("engine-0",)
    for fault in plan(ChaosSettings(minutes=10, pd=False)):
        assert fault.target in targets(2, False)[fault.kind]


@pytest.mark.parametrize(
    ("key", "value"),
    [("engines", 0), ("minutes", 0.0), ("rate", -1.0), ("stream_share", 1.5),
     ("gap_s", (5.0, 1.0)), ("engine_stop_s", (-1.0, 2.0))],
)  # fmt: skip
def test_a_setting_out_of_range_is_named(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        ChaosSettings(**{key: value})  # type: ignore[arg-type]


def test_warm_up_is_five_minutes_or_a_short_runs_first_quarter() -> None:
    assert ChaosSettings(minutes=30).warmup_s == 300.0
    assert ChaosSettings(minutes=2).warmup_s == 30.0
