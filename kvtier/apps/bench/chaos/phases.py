"""A chaos run's requests by phase: steady, during a fault, after it.

    phase(t_s, events, after_s)     -> (phase, kind)   "steady"; "during" a fault (its kind);
                                                       "after" one, within ``after_s`` of its end
    ttft_by_phase(records, events, after_s) -> dict    TTFT count/p50/p99: steady, during, during
                                                       and after per fault kind
    percentile(values, q)           -> float | None    nearest rank
    tier_tokens(provenance)         -> int             prompt tokens kvtier's tiers served
    served_share(records)           -> float | None    of the prompt tokens with provenance
    recovery(records, events, steady, after_s) -> [dict]   per fault: the share before it, in
                                                       the ``after_s`` after it, and when it
                                                       came back within 10 % of ``steady``

A request belongs to the phase its start falls in; "during" wins over "after", and "after" is
the latest fault's. Only answers carrying kvtier's provenance (whole answers) count for the
share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from kvtier.apps.bench.chaos.client import Record
from kvtier.apps.bench.chaos.faults import FaultEvent
from kvtier.scheduler.provenance import NOT_TIERS

WITHIN = 0.1  # "back within 10 % of the steady share"
WINDOWS = 4  # a recovery is looked for in windows of after_s / WINDOWS, sliding by half of one


def phase(t_s: float, events: Sequence[FaultEvent], after_s: float) -> tuple[str, str | None]:
    for event in events:
        if event.start_s <= t_s <= event.end_s:
            return "during", event.kind
    latest = [e for e in events if e.end_s < t_s <= e.end_s + after_s]
    if latest:
        return "after", max(latest, key=lambda e: e.end_s).kind
    return "steady", None


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _figures(values: list[float]) -> dict[str, Any]:
    p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
    return {"count": len(values), "p50_s": None if p50 is None else round(p50, 4),
            "p99_s": None if p99 is None else round(p99, 4)}  # fmt: skip


def ttft_by_phase(
    records: Iterable[Record], events: Sequence[FaultEvent], after_s: float
) -> dict[str, Any]:
    """``{"steady": figures, "during": figures, "during_by_kind": {kind: figures},
    "after_by_kind": {kind: figures}}``, over answered requests."""
    steady: list[float] = []
    during: list[float] = []
    by_kind: dict[str, dict[str, list[float]]] = {"during": {}, "after": {}}
    for record in records:
        if not record.ok or record.ttft_s is None:
            continue
        name, kind = phase(record.start_s, events, after_s)
        if name == "steady":
            steady.append(record.ttft_s)
            continue
        if name == "during":
            during.append(record.ttft_s)
        by_kind[name].setdefault(str(kind), []).append(record.ttft_s)
    return {
        "steady": _figures(steady),
        "during": _figures(during),
        "during_by_kind": {k: _figures(v) for k, v in sorted(by_kind["during"].items())},
        "after_by_kind": {k: _figures(v) for k, v in sorted(by_kind["after"].items())},
    }


def tier_tokens(provenance: dict[str, Any]) -> int:
    return sum(int(v) for k, v in provenance.items() if k not in NOT_TIERS and isinstance(v, int))


def served_share(records: Iterable[Record]) -> float | None:
    served = prompt = 0
    for record in records:
        if record.ok and record.provenance.get("prompt_tokens"):
            served += tier_tokens(record.provenance)
            prompt += int(record.provenance["prompt_tokens"])
    return round(served / prompt, 4) if prompt else None


def _between(records: Sequence[Record], start: float, end: float) -> list[Record]:
    return [r for r in records if start <= r.start_s < end]


def recovery(
    records: Sequence[Record], events: Sequence[FaultEvent], steady: float | None, after_s: float
) -> list[dict[str, Any]]:
    """Per fault: ``share_before`` (the ``after_s`` before it), ``share_after`` (the ``after_s``
    after its end) and ``recovered_s``: the end of the first window after the fault's end whose
    share is at least (1 - 10 %) of ``steady`` (0.0 without a steady share to come back to; None:
    not within ``after_s``, or no answer said)."""
    width = after_s / WINDOWS
    found = []
    for event in events:
        recovered: float | None = 0.0 if not steady else None
        offset = 0.0
        while recovered is None and offset + width <= after_s + 1e-9:
            share = served_share(_between(records, event.end_s + offset, event.end_s + offset
                                          + width))  # fmt: skip
            if share is not None and share >= (1.0 - WITHIN) * (steady or 0.0):
                recovered = round(offset + width, 3)
            offset += width / 2
        found.append({"kind": event.kind, "target": event.target,
                      "share_before": served_share(_between(records, event.start_s - after_s,
                                                            event.start_s)),
                      "share_after": served_share(_between(records, event.end_s,
                                                           event.end_s + after_s)),
                      "recovered_s": recovered})  # fmt: skip
    return found
