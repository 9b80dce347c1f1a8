"""``kvtier bench fleet``'s real part, from its measurements on: each repeat's figures, kv-aware's
ratios against round-robin, the verdict on the TTFT goal, and the plot (no engine runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.apps.bench.fleet.real.fleet import Ran, RealWork
from kvtier.apps.bench.fleet.real.report import plot, report
from kvtier.apps.bench.fleet.real.run import GOAL_TTFT, POLICIES, summarize

TTFT_P50 = {"round-robin": 1.0, "least-loaded": 0.9, "kv-aware": 0.25}  # seconds
COMPUTED = {"round-robin": 20_000, "least-loaded": 18_000, "kv-aware": 7_000}


def _ran(policy: str, repeat: int, outputs: list[list[int]]) -> Ran:
    slower = 1.0 + 0.1 * repeat  # the second repeat 10 % slower for every policy
    ttfts = [TTFT_P50[policy] * slower * k for k in (0.5, 1.0, 1.0, 2.0)]  # median: the p50
    return Ran(policy, ttfts, wall_s=4.0, computed=COMPUTED[policy], prompt_tokens=30_000,
               served=[2, 2], reasons={"prefix": 3, "load": 1}, outputs=outputs)  # fmt: skip


def _found(differ: bool = False) -> dict[str, dict[str, list[Ran]]]:
    same = [[1, 2], [3]]
    found = {name: {p: [_ran(p, r, same) for r in range(2)] for p in POLICIES}
             for name in ("chat", "docs")}  # fmt: skip
    if differ:
        found["docs"]["kv-aware"][1] = _ran("kv-aware", 1, [[1, 2], [4]])
    return found


def test_each_repeats_ratio_against_round_robin_and_whether_outputs_agree() -> None:
    results = summarize(_found(differ=True), RealWork(repeats=2))
    chat = results["workloads"]["chat"]
    assert chat["ttft_p50_ratio"] == [0.25, 0.25] and chat["computed_ratio"] == [0.35, 0.35]
    row = chat["policies"]["kv-aware"][1]
    assert row["ttft_p50_s"] == pytest.approx(0.275) and row["ttft_p90_s"] == pytest.approx(0.55)
    assert row["requests_per_s"] == 1.0 and row["served"] == [2, 2]
    assert chat["outputs_equal"] and not results["workloads"]["docs"]["outputs_equal"]
    assert results["work"]["repeats"] == 2


def test_the_verdict_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = summarize(_found(), RealWork(repeats=2))
    report(results, GOAL_TTFT)
    said = capsys.readouterr().out
    assert "median 0.250 (goal <= 0.6): PASS" in said
    report(results, 0.2)
    assert "FAIL" in capsys.readouterr().out
    plot(results, tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_workload_parameter_below_one_is_named() -> None:
    with pytest.raises(ValueError, match="users must be >= 1"):
        RealWork(users=0)
