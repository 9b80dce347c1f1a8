"""What each part of a hit costs, measured as the engine runs: the scheduler half's cost model.

    HitCosts(clock, wait_tokens)
      started() / ended()                 a request kvtier tracks arrived / finished
      step(tokens, running, timed)        a step is planned: the last one's period is a sample
      loaded(tier, tokens, seconds)       a tier's load job finished on every rank
      view() -> CostView | None           the costs now (None: computing not measured yet)
      decided(loaded, declined)           a hit loaded some tiers and declined others

The costs, in seconds (``CostView``):

    compute   per prompt token the engine computes: the slope of a step's period ~ fixed +
              per_token * tokens (``steps.py``, ``fit.py``), but never less than COMPUTE_FLOOR
              of the average per token of the largest steps: where a step's fixed part dwarfs
              its tokens' (a loaded machine), the slope, fit through class means taken at
              different moments, is mostly noise, and crediting computing with too little
              would decline hits that are cheaper
    wait      what a load that makes its request wait costs it beyond its reads: a step. While
              the engine computes for other requests, the least such a step costs (the line's
              ``fixed``); otherwise a step that computes nothing (measured while requests wait
              for their loads). Never more than computing ``wait_tokens`` tokens (what the
              rules took a wait to cost): a loaded machine's step is the noisiest measure
    tier      its loads' seconds ~ fixed + per_token * tokens (a job's seconds against its
              tokens: for one engine, its bytes per second and its cost per job), fit by size
              class like the steps, a class only once it has three loads (``fit.py``, flat
              where no line fits: a tail of a few tokens never sets a per-token rate). A tier
              with fewer than three loads is not measured yet and costs nothing: it is loaded
              (optimism), and so measured; no single slow load ever declines it

A tier judged too slow is loaded no more, so no new sample would ever tell that it got faster:
once PROBE_AFTER_DECLINED hits declined it and PROBE_AFTER_S passed since a hit last loaded it,
it costs nothing again until a hit loads it (one hit: ``decided`` restarts its clock), and that
load's seconds are its next sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from kvtier.scheduler.costs.fit import CostFit, Line, Smoothed
from kvtier.scheduler.costs.steps import StepTimer

MIN_STEPS = 3  # step samples before computing is taken as measured
MIN_LOADS = 3  # loads before a tier is taken as measured
COMPUTE_FLOOR = 0.5  # of the largest steps' average per token
PROBE_AFTER_S = 10.0
PROBE_AFTER_DECLINED = 8


class CostView(NamedTuple):
    """The costs a hit is decided with (seconds); ``tiers``: each measured tier's load line
    (absent: not measured, or due a probe: free)."""

    compute: float
    wait: float
    tiers: Mapping[str, Line]

    def load(self, tier: str, tokens: int) -> float:
        """Predicted seconds to load ``tokens`` tokens from ``tier``."""
        line = self.tiers.get(tier)
        return 0.0 if line is None or tokens <= 0 else line.at(tokens)


class _Probe:
    __slots__ = ("declined", "last")

    def __init__(self, last: float) -> None:
        self.last = last  # when a hit last loaded the tier, or it was first measured
        self.declined = 0  # hits that declined it since


class HitCosts:
    def __init__(self, clock: Callable[[], float], wait_tokens: int) -> None:
        """``clock``: seconds, monotonic; ``wait_tokens``: the most a wait costs, in tokens
        computed."""
        self.clock = clock
        self.wait_tokens = wait_tokens
        self.steps = StepTimer(clock)
        self.compute = CostFit()
        self.empty = Smoothed()  # seconds of a step that computes nothing
        self.tiers: dict[str, CostFit] = {}  # seconds ~ tokens loaded
        self._probes: dict[str, _Probe] = {}

    def started(self) -> None:
        self.steps.started()

    def ended(self) -> None:
        self.steps.ended()

    def step(self, tokens: int, running: int, timed: bool) -> None:
        sample = self.steps.step(tokens, running, timed)
        if sample is None:
            return
        if sample.tokens:
            self.compute.add(sample.tokens, sample.seconds)
        else:
            self.empty.add(sample.seconds)

    def loaded(self, tier: str, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds < 0:
            return
        self.tiers.setdefault(tier, CostFit(origin=False, steady=True)).add(tokens, seconds)
        self._probes.setdefault(tier, _Probe(self.clock()))

    def view(self) -> CostView | None:
        line = self.compute.line()
        if line is None or self.compute.samples < MIN_STEPS or line.per_unit <= 0:
            return None
        compute = max(line.per_unit, COMPUTE_FLOOR * (self.compute.largest() or 0.0))
        now = self.clock()
        tiers = {
            name: load
            for name, fit in self.tiers.items()
            if fit.samples >= MIN_LOADS
            and (load := fit.line()) is not None
            and not self._due(name, now)
        }
        most = self.wait_tokens * compute
        if self.steps.busy:
            wait = line.fixed if line.fixed > 0 else most
        else:
            wait = most if self.empty.value is None else self.empty.value
        return CostView(compute, min(wait, most), tiers)

    def decided(self, loaded: Iterable[str], declined: Iterable[str]) -> None:
        now = self.clock()
        for tier in loaded:
            probe = self._probes.setdefault(tier, _Probe(now))
            probe.last, probe.declined = now, 0
        for tier in declined:
            self._probes.setdefault(tier, _Probe(now)).declined += 1

    def _due(self, tier: str, now: float) -> bool:
        probe = self._probes.get(tier)
        return (
            probe is not None
            and probe.declined >= PROBE_AFTER_DECLINED
            and now - probe.last >= PROBE_AFTER_S
        )
