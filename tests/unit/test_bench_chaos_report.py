"""``kvtier bench chaos``'s report, on a synthetic run: the reference comparison, the failures
counted apart when an answer was streaming at its engine's kill, memory growth after warm-up,
the verdicts, and the JSON, Markdown page and PNG."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvtier.apps.bench.chaos import report
from kvtier.apps.bench.chaos.client import Record
from kvtier.apps.bench.chaos.faults import FaultEvent
from kvtier.apps.bench.chaos.load import Driven
from kvtier.apps.bench.chaos.memory import Sample, group_rss, growth
from kvtier.apps.bench.chaos.reference import compare
from kvtier.apps.bench.chaos.settings import ChaosSettings
from kvtier.apps.bench.chaos.summarize import counts, passed, summarize
from kvtier.apps.bench.chaos.workload import Ask
from kvtier.apps.bench.common.results import write
from kvtier.apps.bench.pages import page

ENGINE = "http://127.0.0.1:8001"
KILL = FaultEvent("engine-kill", "engine-0", ENGINE, start_s=50.0, end_s=80.0)


def _record(id_: int, start: float, status: str = "ok", **more: Any) -> Record:
    fields: dict[str, Any] = {"end_s": start + 1.0, "ttft_s": 0.2, "tokens": [id_, id_ + 1]}
    return Record(id_, "docs", "fleet", True, 3, start, **(fields | {"status": status} | more))


def _asks(count: int) -> dict[int, Ask]:
    return {i: Ask(i, "docs", 0, 0, [1, 2, i], True, "fleet") for i in range(count)}


def test_every_answer_is_compared_with_the_reference_to_its_prompt() -> None:
    records = [_record(0, 1.0), _record(1, 2.0), _record(2, 3.0, status="broken")]
    reference = {(1, 2, 0): ([0, 1], "x"), (1, 2, 1): ([9, 9], "y"), (1, 2, 2): ([2, 3], "z")}
    assert compare(records, _asks(3), reference) == {
        "compared": 2, "identical": 1, "different": 1, "different_ids": [1],
    }  # fmt: skip


def test_only_streams_started_at_their_engines_kill_are_counted_apart_from_client_errors() -> None:
    records = [
        _record(0, 10.0),
        _record(1, 49.5, "sse-error", started=True, end_s=50.5, route=f"{ENGINE}; prefix; p=0"),
        _record(2, 49.8, "broken", started=False, end_s=50.2),  # had not started: an error
        _record(3, 49.9, "sse-error", started=True, end_s=50.1, route="http://other; prefix"),
        _record(4, 49.0, "ok", end_s=52.0),
        _record(5, 90.0, "timeout", end_s=150.0),
        _record(6, 91.0, "ok", reconnects=3),
    ]
    found = counts(records, [KILL], timeout_s=60.0)
    assert found["sent"] == 7 and found["answered"] == 3 and found["failed"] == 4
    assert found["failed_by_cause"] == {"sse-error": 2, "broken": 1, "timeout": 1}
    assert found["failed_streaming_at_kill"] == 1
    assert found["client_errors"] == 3
    assert found["in_flight_at_kills"] == 4  # requests 1 to 4
    assert found["reconnects"] == 3 and found["past_timeout"] == 1


def test_memory_grows_from_each_groups_warm_up_and_a_server_started_again_is_apart() -> None:
    samples = [Sample(float(t), "proxy", 10, 100 + (t >= 30) * 5) for t in range(0, 61, 5)]
    samples += [Sample(float(t), "engine-0", 20, 1000) for t in range(0, 41, 5)]
    samples += [Sample(float(t), "engine-0", 21, 500 + t) for t in range(45, 200, 5)]
    samples += [Sample(float(t), "redis", 30, 50) for t in range(0, 20, 5)]
    found = growth(samples, warmup_s=15.0)
    assert found["proxy"] == 0.05  # 100 at 15-25 s, 105 at the end
    assert found["engine-0"] == round((500 + 190) / (500 + 65) - 1, 4)  # the restarted group's
    assert found["redis"] is None  # too short after its warm-up


def test_this_processs_group_has_its_rss() -> None:
    assert group_rss()[os.getpgrp()] > 0


def _document() -> dict[str, Any]:
    settings = ChaosSettings.quick(seed=5)
    records = [_record(i, float(i), provenance={"prompt_tokens": 3, "cpu": 1, "computed": 2})
               for i in range(0, 100, 2)]  # fmt: skip
    records.append(_record(101, 60.0, "http", why="502: engine failed"))
    driven = Driven(_asks(102), records, held=1)
    samples = [Sample(float(t), "proxy", 10, 1 << 26) for t in range(0, 100, 2)]
    comparison = {"compared": 50, "identical": 50, "different": 0, "different_ids": []}
    return summarize(settings, driven, [KILL], samples, comparison, reuse_port=False)


def test_the_verdicts_follow_issue_39s_acceptance() -> None:
    found = _document()
    verdicts = {v["name"]: v for v in found["verdicts"]}
    assert verdicts["client errors"] == {"name": "client errors", "value": 1, "goal": "0",
                                         "passed": False}  # fmt: skip
    assert verdicts["different answers"]["passed"] is True
    assert verdicts["past timeout"]["passed"] is True
    assert verdicts["faults not done"]["passed"] is True
    assert verdicts["memory growth of the proxies and engines, largest"]["value"] == 0.0
    assert verdicts["TTFT p99 during a fault / steady"]["value"] == 1.0
    assert verdicts["served share back within 10 %, slowest fault (s)"]["passed"] is True
    assert not passed(found)  # a client error fails the run
    assert found["share"]["steady"] == round(1 / 3, 4)


def test_the_json_page_and_png_are_written_and_the_page_made_again_from_the_json(
    tmp_path: Path,
) -> None:
    found = _document()
    write(tmp_path / "chaos.json", found, report.summary)
    report.plot(found, tmp_path / "chaos.png")
    report.report(found)
    assert (tmp_path / "chaos.png").stat().st_size > 0
    text = (tmp_path / "chaos.md").read_text()
    assert "`kvtier bench chaos --engines 2 --minutes 2 --seed 5 --rate 2 --quick`" in text
    assert "| client errors | 1 | 0 | **FAIL** |" in text
    assert "- engine-kill engine-0: 50.0–80.0 s" in text
    assert json.loads((tmp_path / "chaos.json").read_text())["benchmark"] == "chaos"
    (tmp_path / "chaos.md").unlink()
    assert page(tmp_path / "chaos.json").read_text() == text
