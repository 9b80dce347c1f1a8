"""A chaos run's JSON document: what happened to the requests, by phase, and issue 39's verdicts.

    at_kill(record, events)  -> bool        a streamed answer that had started when its engine
                                            was killed (in flight at the kill, its route that
                                            engine or unknown)
    counts(records, events, timeout_s) -> dict      sent, answered, failed (by cause), ...
    verdicts(document, after_s) -> [dict]   each goal: name, value, goal, passed (None: not
                                            measured)
    summarize(settings, driven, events, samples, comparison, reuse_port) -> dict

The goals (issue 39's acceptance): no client error but answers already streaming when their
engine was killed (those at most the requests in flight at the kills); every answer identical to
the reference; none past its timeout; TTFT p99 during a fault <= 3 x steady; every process's
memory growth after warm-up <= 10 % (Redis's RSS is its data, bounded by its maxmemory: shown,
not judged); kvtier's served share back within 10 % of steady within
``after_s`` of each fault's end. ``CORRECTNESS`` are those a run must pass (its exit status).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from kvtier.apps.bench.chaos.client import Record
from kvtier.apps.bench.chaos.faults import FaultEvent
from kvtier.apps.bench.chaos.load import Driven
from kvtier.apps.bench.chaos.memory import Sample, growth
from kvtier.apps.bench.chaos.phases import phase, recovery, served_share, ttft_by_phase
from kvtier.apps.bench.chaos.schedule import FaultKind
from kvtier.apps.bench.chaos.settings import ChaosSettings
from kvtier.apps.bench.common.results import document

SLACK_S = 1.0  # a request that ended this much past its timeout is past it
TTFT_GOAL, MEMORY_GOAL = 3.0, 0.10
CORRECTNESS = ("client errors", "different answers", "past timeout", "faults not done")
CACHES = ("redis",)  # grow as they fill, up to their bound (maxmemory): shown, not judged


def at_kill(record: Record, events: Sequence[FaultEvent]) -> bool:
    if not record.started:
        return False
    return any(
        e.kind == FaultKind.ENGINE_KILL
        and record.start_s <= e.start_s <= record.end_s
        and (not record.route or record.route.startswith(e.url))
        for e in events
    )


def counts(
    records: Sequence[Record], events: Sequence[FaultEvent], timeout_s: float
) -> dict[str, Any]:
    failed = [r for r in records if not r.ok]
    streaming = sum(at_kill(r, events) for r in failed)
    kills = [e for e in events if e.kind == FaultKind.ENGINE_KILL]
    in_flight = sum(r.start_s <= e.start_s < r.end_s for e in kills for r in records)
    past = sum(r.status == "timeout" or r.end_s - r.start_s > timeout_s + SLACK_S for r in records)
    return {
        "sent": len(records),
        "answered": len(records) - len(failed),
        "failed": len(failed),
        "failed_by_cause": dict(Counter(r.status for r in failed)),
        "failed_streaming_at_kill": streaming,
        "client_errors": len(failed) - streaming,
        "in_flight_at_kills": in_flight,
        "reconnects": sum(r.reconnects for r in records),
        "past_timeout": past,
        "failures": [
            {
                "id": r.id,
                "start_s": round(r.start_s, 3),
                "status": r.status,
                "started": r.started,
                "target": r.target,
                "route": r.route,
                "why": r.why,
            }
            for r in failed
        ],  # fmt: skip
    }


def _verdict(name: str, value: Any, goal: str, passed: bool | None) -> dict[str, Any]:
    return {"name": name, "value": value, "goal": goal, "passed": passed}


def verdicts(found: dict[str, Any], after_s: float) -> list[dict[str, Any]]:
    n, same = found["counts"], found["answers"]
    steady, during = found["ttft"]["steady"]["p99_s"], found["ttft"]["during"]["p99_s"]
    ratio = round(during / steady, 3) if steady and during is not None else None
    grown = [g for name, g in found["memory"]["growth"].items()
             if g is not None and name not in CACHES]  # fmt: skip
    back = [f["recovered_s"] for f in found["share"]["faults"]]
    slowest = None if not back or None in back else max(back)
    undone = sum(not e["done"] for e in found["faults"])
    return [
        _verdict("client errors", n["client_errors"], "0", n["client_errors"] == 0),
        _verdict(
            "failed answers streaming at a kill",
            n["failed_streaming_at_kill"],
            f"<= {n['in_flight_at_kills']}",
            n["failed_streaming_at_kill"] <= n["in_flight_at_kills"],
        ),
        _verdict(
            "different answers",
            same["different"],
            f"0 of {same['compared']}",
            same["different"] == 0 and same["compared"] > 0,
        ),
        _verdict("past timeout", n["past_timeout"], "0", n["past_timeout"] == 0),
        _verdict("faults not done", undone, "0", undone == 0),
        _verdict(
            "TTFT p99 during a fault / steady",
            ratio,
            f"<= {TTFT_GOAL:g}",
            None if ratio is None else ratio <= TTFT_GOAL,
        ),
        _verdict(
            "memory growth of the proxies and engines, largest",
            max(grown, default=None),
            f"<= {MEMORY_GOAL:g}",
            max(grown) <= MEMORY_GOAL if grown else None,
        ),
        _verdict(
            "served share back within 10 %, slowest fault (s)",
            slowest,
            f"<= {after_s:g}",
            (slowest is not None) if back else None,
        ),
    ]


def summarize(
    settings: ChaosSettings,
    driven: Driven,
    events: Sequence[FaultEvent],
    samples: Sequence[Sample],
    comparison: dict[str, Any],
    reuse_port: bool,
) -> dict[str, Any]:
    records = sorted(driven.records, key=lambda r: r.start_s)
    steady = served_share(
        [r for r in records if phase(r.start_s, events, settings.after_s)[0] == "steady"]
    )
    rows = [{k: v for k, v in asdict(r).items() if k not in ("tokens", "text")} for r in records]
    found: dict[str, Any] = {
        "settings": asdict(settings),
        "reuse_port": reuse_port,
        "held": driven.held,
        "counts": counts(records, events, settings.timeout_s),
        "answers": comparison,
        "ttft": ttft_by_phase(records, events, settings.after_s),
        "share": {
            "steady": steady,
            "faults": recovery(records, events, steady, settings.after_s),
        },  # fmt: skip
        "memory": {
            "warmup_s": settings.warmup_s,
            "growth": growth(samples, settings.warmup_s),
            "samples": [s._asdict() for s in samples],
        },  # fmt: skip
        "faults": [asdict(e) for e in events],
    }
    found["verdicts"] = verdicts(found, settings.after_s)
    return document("chaos", rows, torch_too=False, **found)


def passed(found: dict[str, Any]) -> bool:
    """Whether every correctness goal passed (``CORRECTNESS``)."""
    return all(v["passed"] for v in found["verdicts"] if v["name"] in CORRECTNESS)
