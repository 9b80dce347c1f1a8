"""Which mechanism each direction should take on the GPU measured: ``kvtier bench gpu``'s advice.

    advise(document) -> Advice | None   per direction, the mechanism and why; None where no
                                        direction had both mechanisms measured (a CPU run)
    Advice.value                        what to set ``KVTIER_GPU_COPY`` to (``mechanism.py``)

Per direction, first the forward: a mechanism qualifies where, at every shape measured, the
matmul loop with that direction's jobs beside it stays within its goal
(``beside_compute_<direction>`` <= 1.05, the median). Then the hit: of those that qualify, the one
whose worst shape moves the bytes fastest (the least median ``host_<direction>_ratio`` over the
shapes, against its goal); where none qualifies, the one that slows the loop least. A tie keeps
the default. A shape where a mechanism has no figure is left out of its judgement; a mechanism
with no figure at all is not a candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kvtier.apps.bench.gpu.figures import goal, meets
from kvtier.pages.mechanism import DEFAULT, Mechanism, Mechanisms

DIRECTIONS = ("store", "load")


class Choice(NamedTuple):
    mechanism: Mechanism
    why: str


class Advice(NamedTuple):
    store: Choice
    load: Choice

    @property
    def value(self) -> str:
        return str(Mechanisms(self.store.mechanism, self.load.mechanism))

    def as_json(self) -> dict[str, Any]:
        return {"KVTIER_GPU_COPY": self.value,
                **{side: {"mechanism": c.mechanism.value, "why": c.why}
                   for side, c in zip(DIRECTIONS, self, strict=True)}}  # fmt: skip


def advise(document: Mapping[str, Any]) -> Advice | None:
    shapes: Mapping[str, Any] = document.get("shapes", {})
    chosen = [_choose(shapes, side) for side in DIRECTIONS]
    if all(c is None for c in chosen):
        return None
    store, load = (c or Choice(getattr(DEFAULT, side), "not measured: the default")
                   for side, c in zip(DIRECTIONS, chosen, strict=True))  # fmt: skip
    return Advice(store, load)


def _choose(shapes: Mapping[str, Any], side: str) -> Choice | None:
    kind, ratio = f"beside_compute_{side}", f"host_{side}_ratio"
    beside, host = _medians(shapes, kind), _medians(shapes, ratio)
    candidates = [m for m in Mechanism if beside.get(m) or host.get(m)]
    if len(candidates) < 2:
        return None
    default = getattr(DEFAULT, side)
    limit = _goal("", kind)[1]
    if any(beside.get(m) for m in candidates):
        calm = [
            m
            for m in candidates
            if beside.get(m) and all(meets(v, *_goal(s, kind)) for s, v in beside[m].items())
        ]
        said = f"{'both keep' if len(calm) > 1 else 'only it keeps'} the loop within {limit}"
    else:
        calm, said = candidates, "the loop beside not measured"
    if not calm:
        slowest = {m: max(beside.get(m, {}).values(), default=float("inf")) for m in candidates}
        best = min(candidates, key=lambda m: (slowest[m], m is not default))
        figures = ", ".join(f"{m.value} {slowest[m]:.3g}" for m in candidates)
        return Choice(best, f"neither keeps the loop within {limit}; the most it slows it: "
                            f"{figures}")  # fmt: skip
    # the least host ratio over the shapes, each as a share of its shape's goal
    worst = {m: min((v / _goal(s, ratio)[1] for s, v in host.get(m, {}).items()), default=0.0)
             for m in calm}  # fmt: skip
    best = max(calm, key=lambda m: (worst[m], m is default))
    figures = ", ".join(f"{m.value} {worst[m]:.2f}" for m in calm)
    return Choice(best, f"{said}; the worst shape's host ratio / its goal: {figures}")


def _medians(shapes: Mapping[str, Any], figure: str) -> dict[Mechanism, dict[str, float]]:
    """Per mechanism, per shape where it was measured: the figure's median."""
    found: dict[Mechanism, dict[str, float]] = {}
    for shape, section in shapes.items():
        value = section.get(figure)
        if not isinstance(value, Mapping) or "median" in value:
            continue
        for name, part in value.items():
            if name in Mechanism._value2member_map_ and part and part.get("median") is not None:
                found.setdefault(Mechanism(name), {})[shape] = float(part["median"])
    return found


def _goal(shape: str, figure: str) -> tuple[str, float]:
    how, target = goal(shape, figure)
    return how, 1.0 if target is None else target
