"""One engine of a fault campaign: kvtier's engine, its tier seeded, driven through passes and
cases.

    CampaignEngine(campaign, setting, llm, tier, expected, seed)
    .case(fault, rng, share, rank, passes) -> Case   a fault in the tier, then passes
    .passes(case, count)                   -> Case   passes over the prompts, compared
    .drop_host()                                     the host tier emptied (the tier below kept)

Every pass runs the prompts one by one, the engine's own prefix cache emptied before each, so
only kvtier serves, and compares every output with the engine without kvtier (greedy).
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from kvtier.apps.bench.faults.setting import CHUNK, COUNTED, DRAIN_S, Case, Setting
from kvtier.apps.bench.faults.tiers import Fault, TierFaults

if TYPE_CHECKING:
    from vllm import LLM

    from kvtier.apps.bench.faults.campaign import Campaign


class CampaignEngine:
    """One engine with kvtier, its tier seeded with every prompt."""

    def __init__(
        self,
        campaign: Campaign,
        setting: Setting,
        llm: LLM,
        tier: TierFaults | None,
        expected: list[list[int]],
        seed: bool = True,
    ) -> None:
        self.campaign = campaign
        self.setting = setting
        self.llm = llm
        self.tier = tier
        self.expected = expected
        self.cases: list[Case] = []
        self.tier_address: str | None = None  # its tier's path or key prefix
        if seed:  # the host tier and, written through, the tier below
            _, wrong = self._pass()
            if wrong:
                raise AssertionError(f"fault campaign: {wrong} wrong outputs seeding {setting}")

    def _pass(self, reset_each_step: bool = False) -> tuple[float, int]:
        """Every prompt once: (share of full chunks served, or found in a tier whose loading
        the measured costs judged slower than computing them, outputs that differ)."""
        from kvtier.vllm import settle

        declined = self._declined()
        wrong = served = 0
        for prompt, expected in zip(self.campaign.prompts, self.expected):
            if reset_each_step:
                got, tokens = self._generate_resetting(prompt), 0
            else:
                got, tokens = self.campaign._generate_served(self.llm, prompt)
            wrong += got != expected
            served += tokens
        settle(self.llm)
        self._drain()
        served += (self._declined() - declined) * CHUNK  # there: a decision, not a miss
        return served / max(1, self.campaign.full_chunks * CHUNK), wrong

    def _declined(self) -> int:
        """Chunks found in a tier and computed instead, so far (a loaded machine's measured
        costs may judge a tier slower than computing: after a restart, say)."""
        return sum(n for name, n in self._counters().items() if name.endswith(".declined_chunks"))

    def _drain(self, timeout_s: float = DRAIN_S) -> None:
        """Step the idle engine until the tiers below host memory took what they should (a
        write retried after a tier came back, a write-back): what seconds of traffic would
        do, done before the next pass. Bounded: a tier still down is left as it is."""
        from kvtier.vllm import engine_connector

        scheduler = engine_connector(self.llm).scheduler
        core = self.llm.llm_engine.engine_core.engine_core  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout_s
        while scheduler.has_pending_work and time.monotonic() < deadline:
            core.step()

    def _generate_resetting(self, prompt: list[int]) -> list[int]:
        """``prompt``, with the connector reset after every engine step (loads, stores and
        writes in flight)."""
        from vllm import RequestOutput, SamplingParams

        self.llm.reset_prefix_cache()
        engine = self.llm.llm_engine
        params = SamplingParams(
            temperature=0.0, max_tokens=self.campaign.max_tokens, ignore_eos=True
        )
        request_id = f"reset-{time.monotonic_ns()}"
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
        tokens: list[int] = []
        for _ in range(10_000):
            for out in engine.step():
                if out.request_id == request_id and out.finished:
                    assert isinstance(out, RequestOutput)
                    tokens = list(out.outputs[0].token_ids)
            if not engine.has_unfinished_requests():
                return tokens
            engine.reset_prefix_cache(reset_connector=True)
        raise RuntimeError("fault campaign: a request did not finish in 10,000 steps")

    def drop_host(self) -> None:
        """Empty the host tier (chunks in use stay; the tier below is kept)."""
        for _ in range(10_000):
            if self.llm.reset_prefix_cache(reset_connector=True):
                return
            self.llm.llm_engine.step()
        raise RuntimeError("fault campaign: the host tier could not be emptied")

    def case(
        self,
        fault: Fault,
        rng: random.Random,
        share: float = 1.0,
        rank: int | None = None,
        passes: int = 3,
    ) -> Case:
        """``fault`` on ``share`` of the tier's records (of ``rank`` only: None, every rank),
        then ``passes`` passes (1 to 3)."""
        started = time.perf_counter()
        before = self._counters()
        self.drop_host()
        damaged = 0
        if fault is not Fault.RESET:
            assert self.tier is not None, f"fault campaign: {fault.value} needs a tier"
            damaged = self.tier.inject(fault, rng, share, rank)
        return self.passes(Case(self.setting, fault, damaged), passes, started, before)

    def passes(
        self,
        case: Case | None = None,
        count: int = 2,
        started: float = 0.0,
        before: dict[str, int] | None = None,
    ) -> Case:
        """``count`` passes over the prompts (a ``RESET`` case's first resets at every step),
        the host tier emptied before the third; recorded in ``case`` (None: a case of no
        fault of its own, e.g. over a tier damaged before the engine started), with what the
        counters rose by since ``before`` (None: since now)."""
        started = started or time.perf_counter()
        case = case or Case(self.setting, None, 0)
        before = self._counters() if before is None else before
        for n in range(count):
            if n == 2:
                self.drop_host()  # the third pass reads the tier below: it healed
            served, wrong = self._pass(reset_each_step=case.fault is Fault.RESET and n == 0)
            case.passes.append(served)
            case.wrong += wrong
            case.outputs += len(self.campaign.prompts)
        case.seconds = time.perf_counter() - started
        after = self._counters()
        case.counters = {name: value - before.get(name, 0) for name, value in after.items()
                         if value != before.get(name, 0)}  # fmt: skip
        self.cases.append(case)
        return case

    def _counters(self) -> dict[str, int]:
        """The engine's counters of every tier (``COUNTED``), as ``"tier.counter"``."""
        from kvtier.vllm import stats

        return {f"{name}.{counter}": getattr(tier, counter)
                for name, tier in stats(self.llm).tiers.items() for counter in COUNTED}  # fmt: skip
