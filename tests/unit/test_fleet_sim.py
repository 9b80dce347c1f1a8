"""``kvtier bench fleet``'s simulated half (``kvtier/apps/bench/fleet_sim*.py``): an engine's two
caches and the events it publishes, scripted; a small fleet behind the proxy's own index and
scorer against round-robin and the oracle; the files and the goals."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kvtier.apps.bench.fleet.sim.engine import EngineSpec, Hit, SimEngine, SimRequest
from kvtier.apps.bench.fleet.sim.loop import FleetSim
from kvtier.apps.bench.fleet.sim.run import run_sim, simulate
from kvtier.apps.bench.fleet.sim.trace import TRACES, Arrival, Session, Trace, Workload
from kvtier.apps.proxy.prefix_index import PrefixIndex, Run
from kvtier.apps.proxy.scoring import Cached, Loads, choose

BS = 4  # tokens per block
TINY = EngineSpec(gpu_blocks=4, cpu_blocks=6, prefill_per_ms=1.0, decode_ms=10.0, block_size=BS)
ENGINES = 8
SMALL = Workload(sessions_per_engine=64)  # the default load: about 800 requests measured
SMALL_SPEC = EngineSpec()
TIMED = ("decision_us_p50", "decision_us_p99", "decision_cpu_us_p99", "digest_us_p99",
         "hash_us_p99", "sim_s")  # fmt: skip


def _session(first_key: int) -> Session:
    """One round: a 10-token prompt (two full blocks), a 6-token answer (four blocks in all)."""
    tokens = [first_key * 100 + t for t in range(16)]
    keys = [first_key + i for i in range(4)]
    return Session(first_key, tokens, keys, [10], [16], [])


def test_an_engine_publishes_what_it_caches_and_evicts_so_the_index_agrees() -> None:
    index, holders = PrefixIndex(), dict[int, set[int]]()
    engine = SimEngine(0, TINY, holders, partial(index.apply, "e"))
    first = _session(10)
    request = SimRequest(first, 0, 0.0, engine=0, queued=10)
    assert engine.admit(request, now=0.0) == Hit(0, 0)
    assert request.first_ms == 10.0  # ten tokens computed at one a ms
    assert len(index) == 0  # being computed: not a hit yet, not told yet
    engine.prefilled(request)
    engine.finish(request)  # the answer fills two more blocks; all four go to the host tier
    digests = index.digests(first.tokens)
    assert index.runs(digests, ["e"])["e"] == Run({"GPU": 4})
    assert engine.cached(first.keys) == Hit(4, 0)
    second = _session(20)
    other = SimRequest(second, 0, 20.0, engine=0, queued=10)
    engine.admit(other, now=20.0)  # two blocks pinned: the first session's tail is evicted
    assert list(engine.gpu) == [11, 10]
    assert index.runs(digests, ["e"])["e"] == Run({"GPU": 2, "CPU": 2})
    assert engine.cached(first.keys) == Hit(2, 2)
    engine.prefilled(other)
    engine.finish(other)  # the host tier keeps six blocks: the first session's last two go
    assert engine.cached(first.keys) == Hit(0, 2)
    assert index.runs(digests, ["e"])["e"] == Run({"CPU": 2})
    assert holders[10] == {0} and 13 not in holders
    engine.check_integrity()


@pytest.fixture(scope="module")
def fleet() -> dict[str, dict[str, Any]]:
    return {
        row["policy"]: row for row in simulate(ENGINES, seed=0, workload=SMALL, spec=SMALL_SPEC)
    }


def test_kv_aware_finds_far_more_cached_than_round_robin_and_near_the_oracle(
    fleet: dict[str, dict[str, Any]],
) -> None:
    kv, round_robin, oracle = fleet["kv-aware"], fleet["round-robin"], fleet["oracle"]
    assert kv["hit_rate"] >= 1.3 * round_robin["hit_rate"]
    assert kv["hit_rate"] >= 0.9 * oracle["hit_rate"]
    assert kv["ttft_p50_ms"] < 0.5 * round_robin["ttft_p50_ms"]
    for row in fleet.values():
        assert row["requests"] > 600 and 0 < row["hit_rate"] < 1
        assert math.isfinite(row["imbalance"]) and row["imbalance"] >= 1
        assert row["ttft_p50_ms"] <= row["ttft_p90_ms"]
    assert kv["decision_us_p50"] > 0 and kv["index_blocks"] > 0
    assert kv["index_bytes_per_block"] > 0 and kv["index_hashes"] >= kv["index_blocks"]


def test_the_ceiling_bounds_every_policy_and_counts_what_was_computed_before(
    fleet: dict[str, dict[str, Any]],
) -> None:
    """Caches without limit, every block computed so far in every engine: no policy holds more
    (round-robin's run measures it; the others' rows have none)."""
    ceiling = fleet["round-robin"]["ceiling_hit_rate"]
    assert all(row["hit_rate"] <= ceiling for row in fleet.values())
    assert fleet["kv-aware"]["ceiling_hit_rate"] is None
    # every round after a session's first holds its whole history: well above the prompts'
    # shared system prompts, which is most of what round-robin holds
    assert ceiling > 1.5 * fleet["round-robin"]["hit_rate"]


def test_the_index_told_every_event_agrees_with_the_engines_caches() -> None:
    small = EngineSpec(gpu_blocks=256, cpu_blocks=512)  # full: blocks are evicted from both
    sim = FleetSim("kv-aware", 4, Workload(sessions_per_engine=8), small, seed=3)
    sim.run()
    assert sim.index is not None
    for arrival in sim.arrivals:
        session = sim.trace.session(arrival)
        runs = sim.index.runs(sim.index.digests(session.tokens), sim.names)
        for name, engine in zip(sim.names, sim.engines, strict=True):
            hit = engine.cached(session.keys)
            assert runs[name].blocks.get("GPU", 0) == hit.gpu
            assert runs[name].blocks.get("CPU", 0) == hit.cpu
    for engine in sim.engines:
        engine.check_integrity()


def test_a_seed_gives_the_same_run_and_another_seed_another(
    fleet: dict[str, dict[str, Any]],
) -> None:
    again = simulate(
        ENGINES, seed=0, workload=SMALL, spec=SMALL_SPEC, policies=("kv-aware", "round-robin")
    )
    for row in again:
        assert _measured(row) == _measured(fleet[row["policy"]])
    other = simulate(ENGINES, seed=1, workload=SMALL, spec=SMALL_SPEC, policies=("round-robin",))[0]
    assert _measured(other) != _measured(fleet["round-robin"])


def _measured(row: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key not in TIMED}


def test_run_sim_writes_json_and_png_and_judges_the_goals(tmp_path: Path) -> None:
    console = Console(record=True, width=240)
    tiny = Workload(sessions_per_engine=6)
    document = run_sim(tmp_path, engines=(4, 8), workload=tiny, console=console)
    written = json.loads((tmp_path / "fleet-sim.json").read_text())
    assert written["rows"] == document["rows"]
    assert [(r["engines"], r["policy"]) for r in written["rows"]] == [
        (n, p) for n in (4, 8) for p in ("kv-aware", "least-loaded", "round-robin", "oracle")
    ]
    assert (tmp_path / "fleet-sim.png").stat().st_size > 0
    assert written["goals_at_engines"] == 8  # no 64 here: the largest
    assert written["trace"] == "chat"
    goals = {goal["name"]: goal for goal in written["goals"]}
    assert set(goals) == {"hit rate / oracle's", "hit rate / round-robin's", "load imbalance",
                          "decision p99 (us)"}  # fmt: skip
    assert goals["load imbalance"]["passed"] == (goals["load imbalance"]["value"] <= 1.25)
    text = console.export_text()
    assert text.count("PASS") + text.count("FAIL") == 4
    assert "tokens hashed once" in text
    kv = next(row for row in written["rows"] if row["policy"] == "kv-aware")
    assert 0 < kv["hash_us_p99"] and 0 < kv["digest_us_p99"]


def test_the_mrqa_trace_is_lmcaches_multi_round_qa_and_writes_its_own_files(
    tmp_path: Path,
) -> None:
    """One 1,000-token system prompt shared by every user, a 2,000-token history each, 5 rounds
    of a 20-40-token question and a 100-token answer; its files beside the chat trace's."""
    trace = Trace(TRACES["mrqa"], seed=0)
    sessions = [trace.session(Arrival(0.0, number)) for number in range(3)]
    assert len({tuple(session.tokens[1000:3000]) for session in sessions}) == 3  # each its own
    for session in sessions:
        assert session.tokens[:1000] == sessions[0].tokens[:1000]
        assert session.rounds == 5 and 3020 <= session.prompt_ends[0] <= 3040
        assert [a - p for p, a in zip(session.prompt_ends, session.answer_ends)] == [100] * 5
    tiny = Workload(sessions_per_engine=2)
    run_sim(tmp_path, engines=(4,), workload=tiny, console=Console(record=True), trace="mrqa")
    assert json.loads((tmp_path / "fleet-sim-mrqa.json").read_text())["trace"] == "mrqa"
    assert (tmp_path / "fleet-sim-mrqa.png").stat().st_size > 0
    assert not (tmp_path / "fleet-sim.json").exists()
    with pytest.raises(ValueError, match="'sharegpt'"):
        run_sim(tmp_path, engines=(4,), trace="sharegpt")


def test_kv_aware_passes_over_an_engine_past_the_load_bound() -> None:
    # "home" (0) holds the whole prompt, but with this request it would have 6 in flight, over
    # the mean + 1 ((5 + 0 + 1 + 1 + 1) / 4 = 2; 1.25 x 2 is less): the next best, "host" (3),
    # holding it in host memory, wins; the two others hold nothing (the rest's run)
    cached = Cached(Run(), [(Run({"GPU": 8}), [0]), (Run({"CPU": 8}), [3])])
    loads = Loads([5, 0, 1, 1], [0] * 4, [0.0] * 4)
    assert choose("kv-aware", loads, 32, BS, 0, cached).index == 3
    loads = Loads([1, 0, 1, 1], [0] * 4, [0.0] * 4)  # home would have 2: the mean + 1
    assert choose("kv-aware", loads, 32, BS, 0, cached).index == 0
