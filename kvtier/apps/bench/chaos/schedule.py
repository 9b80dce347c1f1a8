"""The faults of a chaos run, drawn from its seed: which, to what, after how quiet a gap.

    FaultKind                       the six faults issue 39 names
    PlannedFault(kind, target, gap_s, hold_s)
    targets(engines, pd)  -> {kind: (target, ...)}   what each kind may be done to
    plan(settings)        -> [PlannedFault]          in order; the same for the same settings

Faults come one at a time: each after a quiet gap (drawn from ``settings.gap_s``) counted from
the previous fault's end, so their times are random and never overlap. The kinds come in rounds,
each round every kind once in a shuffled order (``every_kind_once``: one round), each fault's
target drawn among its kind's. The plan holds more faults than a run has time for; the injector
stops when the run's time is up.
"""

from __future__ import annotations

import math
import random
from enum import StrEnum
from typing import NamedTuple

from kvtier.apps.bench.chaos.settings import ChaosSettings


class FaultKind(StrEnum):
    ENGINE_KILL = "engine-kill"  # SIGKILL to its process group, then started again on its port
    ENGINE_STOP = "engine-stop"  # SIGSTOP for hold_s, then SIGCONT
    REDIS_KILL = "redis-kill"  # SIGKILL, then a new, empty server on its port
    REDIS_STOP = "redis-stop"  # SIGSTOP for hold_s, then SIGCONT
    PROXY_RESTART = "proxy-restart"  # the fleet proxy replaced by a new one on its port
    HOST_RESET = "host-reset"  # an engine's caches (its own and kvtier's) emptied behind the proxy


class PlannedFault(NamedTuple):
    kind: FaultKind
    target: str  # "engine-0", "prefill", "redis", "proxy"
    gap_s: float  # quiet time before it, from the previous fault's end (or the load's start)
    hold_s: float  # how long a stop lasts (0.0 for the other kinds)


def targets(engines: int, pd: bool) -> dict[FaultKind, tuple[str, ...]]:
    """The fleet's engines (and the prefill engine, whose loss the pair's proxy degrades to the
    decode engine) may be killed or stopped; only the fleet's are reset behind its proxy."""
    fleet = tuple(f"engine-{i}" for i in range(engines))
    stoppable = (*fleet, "prefill") if pd else fleet
    return {
        FaultKind.ENGINE_KILL: stoppable,
        FaultKind.ENGINE_STOP: stoppable,
        FaultKind.REDIS_KILL: ("redis",),
        FaultKind.REDIS_STOP: ("redis",),
        FaultKind.PROXY_RESTART: ("proxy",),
        FaultKind.HOST_RESET: fleet,
    }


def plan(settings: ChaosSettings) -> list[PlannedFault]:
    rng = random.Random(settings.seed)
    kinds = targets(settings.engines, settings.pd)
    rounds = 1 if settings.every_kind_once else _rounds(settings, len(kinds))
    planned: list[PlannedFault] = []
    for _ in range(rounds):
        order = list(kinds)
        rng.shuffle(order)
        for kind in order:
            gap = rng.uniform(*settings.gap_s)
            target = rng.choice(kinds[kind])
            planned.append(
                PlannedFault(kind, target, round(gap, 3), round(_hold(kind, settings, rng), 3))
            )
    return planned


def _hold(kind: FaultKind, settings: ChaosSettings, rng: random.Random) -> float:
    if kind is FaultKind.ENGINE_STOP:
        return rng.uniform(*settings.engine_stop_s)
    if kind is FaultKind.REDIS_STOP:
        return rng.uniform(*settings.redis_stop_s)
    return 0.0


def _rounds(settings: ChaosSettings, kinds: int) -> int:
    """Enough rounds that the gaps alone outlast the run."""
    shortest = max(settings.gap_s[0], 1.0)
    return max(1, math.ceil(settings.duration_s / shortest / kinds))
