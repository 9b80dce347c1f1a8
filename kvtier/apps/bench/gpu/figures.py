"""What ``kvtier bench gpu`` reports, and the document that holds it, kept after every measure.

    FIGURES, GOALS, goal(shape, figure)   the per-shape figures, in order, and the issue's goals
    summary(values) -> dict               {"min", "median", "max", "values"}
    Measured(figures, why, details)       what one measure returns
    Unavailable(reason)                   raised by a measure that cannot run here: its figures
                                          are null with the reason
    Results(path, meta)                   the JSON document; ``attempt`` runs one measure so that
                                          one that fails records its error and the rest go on

A figure is a summary, or per mechanism ``{"dma": summary, "kernel": summary}`` (the engine <->
host ones on CUDA; ``{"cpu": summary}`` on the CPU), or null with ``why_null[figure]``. No torch
here: the Markdown report renders from the JSON alone.
"""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common.results import write_document

FIGURES = (
    "host_store_ratio",  # one contiguous copy of the bytes / kvtier's store (higher is better)
    "host_load_ratio",
    "hit_over_prefill",  # host load time / the prefill of the same tokens (lower is better)
    "disk_warm_ratio",  # read + one host->device copy / kvtier's load
    "disk_cold_ratio",
    "redis_ratio",  # raw loopback stream / kvtier's load
    "pull_ratio",  # raw TCP stream / the peer's pull
    "beside_compute_store",  # matmul loop with stores beside it / alone (lower is better)
    "beside_compute_load",
)
AT_LEAST, AT_MOST = ">=", "<="
MAX_LISTED = 32  # a summary lists its values up to this many
# figure: (how it compares, the goal, goals per shape where they differ; None: no goal there)
GOALS: dict[str, tuple[str, float, dict[str, float | None]]] = {
    "host_store_ratio": (AT_LEAST, 0.9, {"70b-tp8": 0.8}),
    "host_load_ratio": (AT_LEAST, 0.9, {"70b-tp8": 0.8}),
    "hit_over_prefill": (AT_MOST, 0.1, {"bench": None, "tiny": None}),
    "disk_warm_ratio": (AT_LEAST, 0.8, {}),
    "disk_cold_ratio": (AT_LEAST, 0.7, {}),
    "redis_ratio": (AT_LEAST, 0.5, {}),
    "pull_ratio": (AT_LEAST, 0.9, {}),
    "beside_compute_store": (AT_MOST, 1.05, {}),
    "beside_compute_load": (AT_MOST, 1.05, {}),
}


def goal(shape: str, figure: str) -> tuple[str, float | None]:
    """(">=" or "<=", the goal at ``shape``; None where the issue sets none)."""
    how, default, per_shape = GOALS[figure]
    return how, per_shape.get(shape, default)


def meets(value: float, how: str, target: float) -> bool:
    return value >= target if how == AT_LEAST else value <= target


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Min, median and max of ``values``, and the values themselves when there are few."""
    if not values:
        raise ValueError("no values to summarize")
    described: dict[str, Any] = {"min": _short(min(values)),
                                 "median": _short(statistics.median(values)),
                                 "max": _short(max(values))}  # fmt: skip
    if len(values) <= MAX_LISTED:
        described["values"] = [_short(v) for v in values]
    return described


def _short(value: float) -> float:
    return float(f"{value:.5g}")


def ratios(bound: Sequence[float], kvtier: Sequence[float]) -> dict[str, Any]:
    """Paired ``bound[i] / kvtier[i]``: kvtier's throughput over the bound's (1.0: as fast)."""
    return summary([b / k for b, k in zip(bound, kvtier, strict=True)])


class Unavailable(Exception):
    """The measure cannot run here (no Redis server, no model of the shape): null, with why."""


@dataclass
class Measured:
    figures: dict[str, Any] = field(default_factory=dict)  # figure -> value (None: see why)
    why: dict[str, str] = field(default_factory=dict)  # figure -> why it is null
    details: dict[str, Any] = field(default_factory=dict)  # seconds, MiB/s, notes


class Results:
    """The JSON document at ``path``, rewritten (atomically) after every measure, so that a run
    cut short keeps what it measured."""

    def __init__(self, path: Path, meta: Mapping[str, Any]) -> None:
        self.path = path
        self.document: dict[str, Any] = {**meta, "shapes": {}, "errors": []}
        self.write()

    def shape(self, name: str, **about: Any) -> dict[str, Any]:
        """The shape's section, its figures null until measured."""
        shapes = self.document["shapes"]
        if name not in shapes:
            shapes[name] = {**about, **dict.fromkeys(FIGURES), "why_null": {}, "details": {}}
        section: dict[str, Any] = shapes[name]
        return section

    def attempt(
        self, shape: str | None, name: str, figures: Sequence[str], measure: Callable[[], Measured]
    ) -> Measured | None:
        """Run ``measure`` and record its figures under ``shape`` (None: the document's top
        level) and its details under ``name``; if it raises, its figures are null with the
        error (``Unavailable``: with the reason) and None is returned."""
        section = self.document if shape is None else self.shape(shape)
        why = section.setdefault("why_null", {})
        try:
            measured = measure()
        except Unavailable as reason:
            measured = None
            for figure in figures:
                section[figure], why[figure] = None, str(reason)
            if not figures:  # a measure of details only: why they are not there
                section.setdefault("details", {})[name] = {"unavailable": str(reason)}
        except Exception as error:  # one measure's failure must not end the run
            measured = None
            text = f"error: {type(error).__name__}: {error}"
            for figure in figures:
                section[figure], why[figure] = None, text
            trace = traceback.format_exc()[-4000:]
            self.document["errors"].append({"shape": shape, "measure": name, "error": text,
                                            "traceback": trace})  # fmt: skip
        else:
            assert measured is not None
            for figure in figures:
                section[figure] = measured.figures.get(figure)
                if section[figure] is None:
                    why[figure] = measured.why.get(figure, "not measured")
                else:
                    why.pop(figure, None)
            section.setdefault("details", {})[name] = measured.details
        self.write()
        return measured

    def write(self) -> None:
        write_document(self.path, self.document)


def rows(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The table: one row per shape, figure and mechanism, with its goal and whether the median
    meets it (None: no figure, or no goal)."""
    out = []
    for shape, section in document.get("shapes", {}).items():
        for figure in FIGURES:
            value = section.get(figure)
            how, target = goal(shape, figure)
            if value is None:
                why = section.get("why_null", {}).get(figure, "not measured")
                out.append({"shape": shape, "figure": figure, "mechanism": "", "min": None,
                            "median": None, "max": None, "how": how, "goal": target,
                            "met": None, "why": why})  # fmt: skip
                continue
            parts = value.items() if "median" not in value else [("", value)]
            for mechanism, part in parts:
                met = None if target is None else meets(part["median"], how, target)
                out.append({"shape": shape, "figure": figure, "mechanism": mechanism,
                            "min": part["min"], "median": part["median"], "max": part["max"],
                            "how": how, "goal": target, "met": met, "why": ""})  # fmt: skip
    return out
