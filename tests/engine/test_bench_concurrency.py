"""``kvtier bench concurrency --quick`` end to end on the tiny model, run as a user's fresh shell
runs it (only PATH and HOME): engine processes with and without kvtier serve interleaved rounds,
every round is timed, and the JSON's ratios are the ones its measured rounds make (the served
long-miss part: its summary from given TTFTs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fresh_shell import run_kvtier

from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.concurrency import run as concurrency
from kvtier.apps.bench.concurrency.rounds import Rounds
from kvtier.apps.bench.concurrency.rounds import summarize as summarize_rounds
from kvtier.apps.bench.concurrency.served import LongMiss, summarize

VERDICT_KEYS = {"key", "label", "ratio", "min", "max", "spread", "pairs", "goal", "pass"}


def test_bench_concurrency_rounds_ratios_come_from_the_measured_rounds(tmp_path: Path) -> None:
    run_kvtier(
        "bench", "concurrency", "--quick", "--no-served", "--out", str(tmp_path), timeout=900
    )
    assert concurrency.QUICK == Rounds(prompts=8, tokens=64, max_tokens=4, rounds=3, pairs=1,
                                       max_num_seqs=8, chunk_tokens=32)  # fmt: skip

    document = json.loads((tmp_path / "concurrency.json").read_text())
    assert (tmp_path / "concurrency.png").stat().st_size > 0
    rounds = document["rounds"]
    assert [(p["pair"], p["config"]) for p in rounds["processes"]] == [
        (0, "baseline"), (0, "kvtier")
    ]  # fmt: skip
    times = {}
    for process in rounds["processes"]:
        assert len(process["round_s"]) == 3 and all(t > 0 for t in process["round_s"])
        times[process["config"]] = process["round_s"][1:]  # after the warm-up round
        assert process["median_round_s"] == pytest.approx(median(times[process["config"]]),
                                                          abs=1e-4)  # fmt: skip
    kvtier = rounds["processes"][1]["kvtier_cpu"]
    assert kvtier["stored_chunks"] >= 3 * 8 * 2 and kvtier["hit_chunks"] == 0  # 64 tokens: 2 chunks
    # the median of the rounds' ratios; the JSON's rounds are rounded to 0.1 ms: a ratio of
    # rounds of a few ms carries that error
    per_round = [a / b for a, b in zip(times["baseline"], times["kvtier"], strict=True)]
    assert rounds["ratios"] == [pytest.approx(median(per_round), rel=2e-2)]

    # kvtier's calls, clocked on its engine's thread: some time every round, less than the round
    spent, served = rounds["processes"][1]["connector_s"], rounds["processes"][1]["round_s"]
    assert rounds["processes"][0]["connector_s"] is None  # no connector
    assert len(spent) == 3 and all(0 < s < t for s, t in zip(spent, served, strict=True))
    shares = [s / t for s, t in zip(spent[1:], times["kvtier"], strict=True)]
    assert rounds["connector_shares"] == {"kvtier": [pytest.approx(median(shares), rel=2e-2)]}

    row, own_time = document["rows"]
    assert own_time["key"] == "rounds_own_time" and own_time["goal"] is None
    assert own_time["ratio"] == round(rounds["connector_shares"]["kvtier"][0], 3)
    assert VERDICT_KEYS <= row.keys() and row["key"] == "rounds" and row["pairs"] == 1
    assert row["ratio"] == row["min"] == row["max"] == round(rounds["ratios"][0], 3)
    assert row["goal"] == ">= 0.97" and row["pass"] == (row["ratio"] >= 0.97)
    assert document["all_pass"] == row["pass"]
    assert document["models"] == {"rounds": ["tiny", "float32"]}
    page = (tmp_path / "concurrency.md").read_text()
    assert "`kvtier bench concurrency --quick --pairs 1 --rounds 3 --no-served`" in page


def test_long_miss_ratios_are_mean_ttft_over_pairs() -> None:
    ttfts = {"kvtier": [[1.0, 3.0], [2.0, 2.0]], "alone": [[1.0, 1.0], [2.0, 6.0]]}
    record = summarize(ttfts, LongMiss(documents=2, pairs=2), {"stored_chunks": 9.0})
    assert record["mean_ttft_s"] == {"kvtier": [2.0, 2.0], "alone": [1.0, 4.0]}
    assert record["ratios"] == [2.0, 0.5]
    assert concurrency.verdict("long_miss", record["ratios"])["ratio"] == 1.25
    assert not concurrency.verdict("long_miss", record["ratios"])["pass"]  # goal <= 1.02


def test_a_pairs_ratio_is_the_median_of_its_rounds_ratios_and_the_null_connector_a_bound() -> None:
    """Rounds after the warm-up, paired by round: baseline's time / each engine's."""
    work = Rounds(rounds=4, pairs=1, filled_host="64MiB", null=True)
    rounds = {"baseline": [9.0, 1.0, 2.0, 4.0], "kvtier": [9.0, 1.25, 2.0, 5.0],
              "kvtier-filled": [9.0, 1.0, 2.5, 4.0], "null": [9.0, 1.0, 2.0, 4.2]}  # fmt: skip
    processes = [{"pair": 0, "config": config, "round_s": times}
                 for config, times in rounds.items()]  # fmt: skip
    record = summarize_rounds(processes, work)
    assert record["ratios"] == [0.8]  # 0.8, 1.0, 0.8
    assert record["filled_ratios"] == [1.0]  # 1.0, 0.8, 1.0
    assert record["null_ratios"] == [pytest.approx(1.0)]
    assert record["processes"][1]["median_round_s"] == 2.0
    bound = concurrency.verdict("rounds_null", record["null_ratios"])
    assert bound["pass"] is None and bound["goal"] is None
    assert concurrency.verdict("rounds", record["ratios"])["pass"] is False
