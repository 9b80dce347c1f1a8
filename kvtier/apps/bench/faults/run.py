"""``kvtier bench faults``: the fault campaign at random, for as long as it is asked to run.

A hypothesis state machine drives engines with kvtier (``campaign.py``) through passes
over prompts that share prefixes, faults in their tiers (bit flips, truncation, another chunk's
record, another model's, read errors, a tier killed and restarted), evictions (the host tier
emptied), connector resets while loads and stores run, and engine restarts over the tiers they
left. Settings rotate: disk and Redis tiers, host tiers of 4 chunks and roomy, synchronous,
asynchronous and default reads. Every output is compared with the engine without kvtier.

Writes ``faults.json``, ``.md`` and ``.png`` (per setting: faults injected, outputs compared,
wrong outputs; ``report.py``) and prints the totals; exits 1 if any output was wrong (the goal:
none). Its engines run in this process: ``common.engine_env`` must be applied (the command
does).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common.results import write_json
from kvtier.apps.bench.faults import report
from kvtier.apps.bench.faults.campaign import Campaign, shared_prefix_prompts
from kvtier.apps.bench.faults.engine import CampaignEngine
from kvtier.apps.bench.faults.setting import Setting
from kvtier.apps.bench.faults.tiers import Fault

SETTINGS = [
    *(Setting("disk", host, reads) for host in ("tiny", "roomy") for reads in
      ("sync", "async", "default")),
    *(Setting("redis", host, "async") for host in ("tiny", "roomy")),
]  # fmt: skip
TIER_FAULTS = [fault for fault in Fault if fault is not Fault.RESET]
STEPS = 15  # rules per hypothesis example
EXAMPLES = 4  # examples per engine, before it is restarted over its tiers (the first is
# hypothesis's simplest: passes only)


@dataclass
class Tally:
    """What one setting went through."""

    faults: Counter[str] = field(default_factory=Counter)
    outputs: int = 0
    wrong: int = 0
    passes: int = 0
    engines: int = 0
    served: list[float] = field(default_factory=list)  # the pass after each fault's

    def as_row(self, setting: Setting) -> dict[str, Any]:
        served = sorted(self.served)
        return {
            "setting": str(setting),
            "engines": self.engines,
            "faults": dict(self.faults),
            "faults_injected": sum(self.faults.values()),
            "passes": self.passes,
            "outputs_compared": self.outputs,
            "wrong_outputs": self.wrong,
            "served_after_fault_min": served[0] if served else None,
            "served_after_fault_median": served[len(served) // 2] if served else None,
        }


def _machine(run: CampaignEngine, tally: Tally, rng: random.Random) -> type:
    """A state machine class driving ``run`` (one live engine). Its rules draw nothing from the
    engine or the clock, and raise only on a wrong output (hypothesis requires an example's
    draws to depend on its own choices only): the time limit is checked between runs."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

    class FaultMachine(RuleBasedStateMachine):
        @rule()
        def a_pass(self) -> None:
            self._count(run.passes(count=1))

        @rule(
            fault=st.sampled_from(TIER_FAULTS),
            share=st.sampled_from([0.25, 0.5, 1.0]),
            passes=st.integers(1, 3),
        )
        def a_fault(self, fault: Fault, share: float, passes: int) -> None:
            self._count(run.case(fault, rng, share, None, passes), fault)

        @rule()
        def an_eviction(self) -> None:
            run.drop_host()

        @rule()
        def a_reset_mid_load(self) -> None:
            self._count(run.case(Fault.RESET, rng, passes=1), Fault.RESET)

        @invariant()
        def never_wrong(self) -> None:
            assert tally.wrong == 0, f"{tally.wrong} wrong outputs ({run.setting})"

        def _count(self, case: Any, fault: Fault | None = None) -> None:
            tally.outputs += case.outputs
            tally.wrong += case.wrong
            tally.passes += len(case.passes)
            if fault is not None:
                tally.faults[fault.value] += 1
                if len(case.passes) > 1:
                    tally.served.append(case.passes[1])

    return FaultMachine


def run(
    out: Path, minutes: float, seed: int = 0, examples: int = EXAMPLES, steps: int = STEPS
) -> int:
    """Run the campaign for ``minutes`` (each engine ``examples`` hypothesis examples of
    ``steps`` rules; the first engine runs whatever the time); write the results under ``out``;
    the exit status (1: a wrong output)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvtier.apps.bench.common.redis_server import RedisServer
    from kvtier.apps.models import model_path

    if minutes <= 0:
        raise ValueError(f"kvtier bench faults: --minutes must be > 0, got {minutes}")
    model = model_path("tiny")
    prompts = shared_prefix_prompts(model, [200, 300, 420], 2)
    rng = random.Random(seed)
    tallies = {setting: Tally() for setting in SETTINGS}
    stop = time.monotonic() + 60 * minutes
    started = time.monotonic()
    config = settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as work, RedisServer() as redis:
        campaign = Campaign(model, prompts, Path(work), redis=redis)
        campaign.reference()
        tiers: dict[Setting, Any] = {}  # a restarted engine finds its tier as it was left
        while True:  # one engine at least, whatever the time
            setting = rng.choice(SETTINGS)
            tally = tallies[setting]
            with campaign.engine(setting, tier=tiers.get(setting), seed=True) as engine:
                tiers[setting] = engine.tier_address
                tally.engines += 1
                run_state_machine_as_test(_machine(engine, tally, rng), settings=config)
            _progress(tallies, started, stop)
            if time.monotonic() >= stop:
                break
    rows = [tally.as_row(setting) for setting, tally in tallies.items()]
    meta = {"minutes": minutes, "seed": seed, "prompts": len(prompts), "examples": examples,
            "steps": steps}  # fmt: skip
    write_json(out / "faults.json", "faults", rows, report.summary, **meta)
    report.plot(out / "faults.png", rows)
    wrong = sum(row["wrong_outputs"] for row in rows)
    faults = sum(row["faults_injected"] for row in rows)
    outputs = sum(row["outputs_compared"] for row in rows)
    print(f"kvtier bench faults: {faults} faults injected, {outputs} outputs compared with the "
          f"engine without kvtier, {wrong} wrong (goal: 0) in {minutes:g} min")  # fmt: skip
    return 1 if wrong else 0


def _progress(tallies: dict[Setting, Tally], started: float, stop: float) -> None:
    done = sum(t.outputs for t in tallies.values())
    faults = sum(sum(t.faults.values()) for t in tallies.values())
    wrong = sum(t.wrong for t in tallies.values())
    left = max(0.0, stop - time.monotonic())
    print(f"  {time.monotonic() - started:6.0f} s: {faults} faults, {done} outputs, {wrong} "
          f"wrong; {left:.0f} s left", flush=True)  # fmt: skip
