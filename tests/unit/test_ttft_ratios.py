"""``kvtier bench ttft``'s arithmetic, without an engine: paired ratios, the spread of their median,
the goals' verdicts, and the command line's sizes."""

from __future__ import annotations

import pytest

from kvtier.apps.bench.common.ratios import Ratio, paired, spread
from kvtier.apps.bench.ttft import run as ttft
from kvtier.apps.bench.ttft.ratios import GOALS, verdict
from kvtier.apps.bench.ttft.setup import Workload, loadable_chunks


def test_paired_ratio_is_the_median_of_the_pairs() -> None:
    ratio = paired([2.0, 3.0, 10.0], [1.0, 3.0, 5.0])  # pairs: 2, 1, 2
    assert ratio.median == 2.0 and ratio.pairs == 3


def test_spread_is_the_half_width_of_the_medians_confidence_interval() -> None:
    assert spread([1.0] * 9) == 0.0
    assert spread([0.9, 1.0, 1.1]) == pytest.approx(0.1)  # few pairs: the whole range
    many = sorted(1.0 + (i % 5 - 2) * 0.01 for i in range(100))  # 20 each of 0.98 .. 1.02
    assert spread(many) == pytest.approx(0.01)  # ranks 40 and 61 of 100: 0.99 and 1.01
    assert spread(many[::10]) == pytest.approx(0.02)  # 10 pairs: the whole range


def test_verdicts_hold_each_goal_in_its_direction() -> None:
    assert verdict("kvtier_over_engine_hit", Ratio(1.0, 0.01, 5), 1024)["pass"] is True
    assert verdict("kvtier_over_engine_hit", Ratio(1.01, 0.01, 5), 1024)["pass"] is False
    assert verdict("engine_hit_on_over_off", Ratio(1.1, 0.01, 5), 1000)["pass"] is True
    row = verdict("throughput_ratio", Ratio(0.97, 0.01, 12), None)
    assert row["pass"] is False and row["goal"] == ">= 0.98" and row["pairs"] == 12
    assert set(GOALS) == {"engine_hit_on_over_off", "kvtier_over_engine_hit", "throughput_ratio"}


def test_loadable_chunks_stop_before_the_last_token() -> None:
    assert [loadable_chunks(n, 64) for n in (64, 65, 1000, 1024, 1025)] == [0, 1, 15, 15, 16]


def test_options_quick_sizes_and_overrides() -> None:
    quick = ttft.options(True, repeats=None, lengths=[2048])
    assert quick["lengths"] == (2048,) and quick["unaligned"] == (1000,)
    assert quick["repeats"] == 3 and quick["workload"].pairs == 4
    full = ttft.options(False, unaligned=[])
    assert full["unaligned"] == () and full["workload"].max_pairs == Workload().max_pairs
