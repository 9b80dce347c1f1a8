"""``kvtier bench concurrency``'s rounds with the filled process (A B C): its engine gets kvtier
with the small host tier, and its ratios are the baseline's median round over its own, beside
kvtier's; the verdict and plot carry both (no engine: synthetic rounds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.apps.bench.concurrency import report
from kvtier.apps.bench.concurrency import run as concurrency
from kvtier.apps.bench.concurrency.rounds import FILLED, Rounds, engine_args, summarize


def _process(pair: int, config: str, seconds: float) -> dict[str, object]:
    return {"pair": pair, "config": config, "round_s": [9.0, seconds, seconds, seconds + 1.0]}


def test_the_filled_process_is_kvtier_with_the_small_host_tier(tmp_path: Path) -> None:
    work = Rounds(filled_host="64MiB")
    assert work.configs == ("baseline", "kvtier", FILLED)
    assert Rounds().configs == ("baseline", "kvtier")
    filled = engine_args(tmp_path, "float32", work, FILLED)["kv_transfer_config"]
    roomy = engine_args(tmp_path, "float32", work, "kvtier")["kv_transfer_config"]
    assert filled["kv_connector"] == roomy["kv_connector"] == "KVTierConnector"
    assert filled["kv_connector_extra_config"]["cpu_bytes_to_use"] == "64MiB"
    assert roomy["kv_connector_extra_config"]["cpu_bytes_to_use"] == "2GiB"
    assert engine_args(tmp_path, "float32", work, "baseline")["kv_transfer_config"] is None


def test_filled_ratios_sit_beside_kvtiers_and_get_their_own_row(tmp_path: Path) -> None:
    work = Rounds(rounds=4, pairs=2, filled_host="64MiB")
    times = {"baseline": 1.0, "kvtier": 1.25, FILLED: 1.1}
    processes = [_process(pair, config, times[config] * (1 + pair / 10))
                 for pair in range(2) for config in work.configs]  # fmt: skip
    part = summarize(processes, work)
    assert part["ratios"] == [pytest.approx(0.8, abs=1e-4)] * 2
    assert part["filled_ratios"] == [pytest.approx(1 / 1.1, abs=1e-4)] * 2
    assert "filled_ratios" not in summarize(processes[:2] + processes[3:5], Rounds(pairs=2))

    ratios = {"rounds": part["ratios"], "rounds_filled": part["filled_ratios"]}
    rows = [concurrency.verdict(key, values) for key, values in ratios.items()]
    assert [(row["key"], row["ratio"], row["pass"]) for row in rows] == [
        ("rounds", 0.8, False), ("rounds_filled", 0.909, False)
    ]  # fmt: skip
    report.plot(rows, ratios, concurrency.GOALS, tmp_path / "concurrency.png")
    assert (tmp_path / "concurrency.png").stat().st_size > 0
    json.dumps(part)  # the JSON's rounds part


def test_the_rounds_are_written_before_the_long_miss_and_quietly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``run`` writes once the rounds are measured, before the long miss starts: a long
    miss that fails (a server that times out) loses no rounds."""
    work = Rounds(rounds=3, pairs=1, filled_host="64MiB")
    times = {"baseline": 1.0, "kvtier": 1.25, FILLED: 1.1}
    processes = [_process(0, config, times[config]) for config in work.configs]
    parts = {"rounds": summarize(processes, work)}
    concurrency._report(tmp_path, parts, dict(concurrency.MODELS), 0.0, quiet=True)
    assert capsys.readouterr().out == ""
    document = json.loads((tmp_path / "concurrency.json").read_text())
    assert [row["key"] for row in document["rows"]] == ["rounds", "rounds_filled"]
    assert "long_miss" not in document and document["rounds"]["ratios"] == [0.8]
    assert (tmp_path / "concurrency.png").stat().st_size > 0


def test_each_connectors_time_on_its_thread_is_a_share_of_its_rounds_and_a_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The median over the counted rounds of connector seconds / round seconds, per process with
    a connector; kvtier's and the do-nothing connector's each get a row without a goal."""
    work = Rounds(rounds=4, pairs=1, null=True)
    processes = [_process(0, config, 2.0) for config in work.configs]
    spent = {"kvtier": [5.0, 0.1, 0.3, 0.15], "null": [1.0, 0.002, 0.004, 0.003]}
    for process in processes:
        process["connector_s"] = spent.get(str(process["config"]))  # baseline: None
    part = summarize(processes, work)
    # rounds 2.0, 2.0, 3.0 after the warm-up: kvtier 0.05, 0.15, 0.05; null 0.001, 0.002, 0.001
    assert part["connector_shares"] == {"kvtier": [0.05], "null": [0.001]}
    assert [p.get("connector_share") for p in part["processes"]] == [None, 0.05, 0.001]

    concurrency._report(tmp_path, {"rounds": part}, dict(concurrency.MODELS), 0.0)
    document = json.loads((tmp_path / "concurrency.json").read_text())
    rows = {row["key"]: row for row in document["rows"]}
    assert list(rows) == ["rounds", "rounds_null", "rounds_over_null", "rounds_own_time",
                          "rounds_null_own_time"]  # fmt: skip
    assert rows["rounds_own_time"]["ratio"] == 0.05 and rows["rounds_own_time"]["goal"] is None
    assert rows["rounds_null_own_time"]["ratio"] == 0.001
    assert document["all_pass"] == rows["rounds"]["pass"]  # shares judge nothing
    label = "kvtier's calls: time on the engine's thread / the round"
    assert f"{label}: 0.050 (min 0.050" in capsys.readouterr().out
    assert f"| {label} | 0.050 |" in (tmp_path / "concurrency.md").read_text()
