"""One policy routing one trace over a simulated fleet: the proxy's own index and scorer at work.

    FleetSim(policy, engines, workload, spec, seed).run() -> dict   what it measured (one row)
    POLICIES                                                        the proxy's, and "oracle"

Events happen in simulated time (ms): a session starts, a round is sent, a request's prefill ends
(its blocks are published), a request finishes (its answer's blocks and the host tier's stores
are published; the session's next round is sent after its think time). The proxy's side is kept
as ``placement.py`` keeps it: requests in flight per engine (sent, not finished), prompt tokens
queued (those it expects the engine to compute, until the prefill ends), a decaying count of
requests sent lately (``placement.RECENT``), and, for ``kv-aware``, a ``PrefixIndex`` told
every event at once (no delay) and ``scoring.choose`` over its runs and the engines' counts, as
``placement.py`` passes them. ``oracle`` reads the engines' caches themselves: the longest cached
prefix among the engines the same load bound lets take the request (``scoring.LOAD_BOUND``:
without it, every new session piles onto the engines that first held its system prompt), ties to
the fewest requests in flight (then round-robin).

Measured over the requests sent in the window (after the first ``workload.warmup`` of the arrivals'
span, until the last session starts; the simulation stops there): the hit rate (prompt tokens the
chosen engine held at dispatch, in GPU or host memory, less the last token, over prompt tokens), the
load imbalance (max / mean requests in flight over the engines, taken just after each dispatch, the
request sent included, and averaged over those dispatches), TTFT (queue wait and own prefill: known
at dispatch), and for ``kv-aware`` the time of each decision (``perf_counter_ns`` around the
prompt's stretches with their digests and ``choose``; also the thread's CPU time, which a busy
machine's preemptions do not inflate; and, timed apart, the prompt's digests alone, every block, and
its tokens hashed once, as one tuple: the least work of any router in Python that keys a prompt by
its tokens) and, at the window's end, the index's size: its objects' ``sys.getsizeof`` summed over a
walk of its containers (each object once), per block it holds.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import time
from array import array
from collections.abc import Callable
from functools import partial
from typing import Any

from kvtier.apps.bench.fleet.sim.engine import EngineSpec, SimEngine, SimRequest
from kvtier.apps.bench.fleet.sim.stats import Spent, Stats, deep_size, percentile
from kvtier.apps.bench.fleet.sim.trace import Arrival, Session, Trace, Workload, arrivals
from kvtier.apps.proxy import scoring
from kvtier.apps.proxy.kv_events import Event
from kvtier.apps.proxy.placement import RECENT
from kvtier.apps.proxy.positions import Positions
from kvtier.apps.proxy.prefix_index import PrefixIndex
from kvtier.apps.proxy.scoring import LOAD_BOUND, Held, Loads, choose

ORACLE = "oracle"
POLICIES = (*scoring.POLICIES, ORACLE)
DECAY = 1.0 - 1.0 / RECENT


class FleetSim:
    def __init__(
        self, policy: str, engines: int, workload: Workload, spec: EngineSpec, seed: int
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
        if spec.block_size != workload.block_size:
            raise ValueError("the engines' block_size must be the workload's")
        self.policy, self.workload, self.spec = policy, workload, spec
        self.trace = Trace(workload, seed)
        self.arrivals = arrivals(workload, engines, seed)
        span = self.arrivals[-1].at_ms
        self.window = (workload.warmup * span, span)
        # block key -> the engines that could serve it now (the oracle's, kept for it only)
        self.holders: dict[int, set[int]] | None = {} if policy == ORACLE else None
        self.index = PrefixIndex() if policy == "kv-aware" else None
        # every block computed so far, anywhere (round-robin's run only): the ceiling's
        self.seen: set[int] | None = set() if policy == "round-robin" else None
        self.names = [f"http://engine-{i}:8000" for i in range(engines)]
        self.positions = Positions(self.names)
        self.engines = [
            SimEngine(i, spec, self.holders, self._publisher(i)) for i in range(engines)
        ]
        # each engine's counts by position, as arrays of C numbers: the compiled decision
        # reads 8 engines' from one cache line, not an object per engine
        self.in_flight = array("q", bytes(8 * engines))
        self.queued = array("q", bytes(8 * engines))
        self.recent = array("d", bytes(8 * engines))
        self.turn = 0
        self.events: list[tuple[float, int, Callable[[float], None]]] = []
        self.sequence = itertools.count()  # orders events due at the same time
        self.stats = Stats()

    def _publisher(self, number: int) -> Callable[[list[Event]], object] | None:
        index = self.index
        return None if index is None else partial(index.apply, self.names[number])

    def run(self) -> dict[str, Any]:
        """Play the trace to the window's end. The collector is paused meanwhile: the
        simulator's own heap (every engine's caches, the sessions) would put its pauses into
        the proxy's decisions; nothing it drops is cyclic."""
        started = time.perf_counter()
        for arrival in self.arrivals:
            self._at(arrival.at_ms, partial(self._open, arrival))
        collecting = gc.isenabled()
        gc.disable()
        try:
            while self.events:
                now, _, act = heapq.heappop(self.events)
                if now > self.window[1]:
                    break  # nothing later is measured
                act(now)
        finally:
            self.events.clear()  # what was left refers to self
            if collecting:
                gc.enable()
        if self.index is not None:
            self.stats.index_blocks = len(self.index)
            self.stats.index_hashes = sum(self.index.hashes(name) for name in self.names)
            self.stats.index_bytes = deep_size(self.index)
        return self._row(time.perf_counter() - started)

    def _at(self, when: float, act: Callable[[float], None]) -> None:
        heapq.heappush(self.events, (when, next(self.sequence), act))

    def _open(self, arrival: Arrival, now: float) -> None:
        self._send(self.trace.session(arrival), 0, now)

    def _send(self, session: Session, round_: int, now: float) -> None:
        n = session.prompt_ends[round_]
        number, predicted, spent = self._route(session, n)
        request = SimRequest(session, round_, now, number, n - predicted)
        hit = self.engines[number].admit(request, now)
        self.in_flight[number] += 1
        self.queued[number] += request.queued
        self._at(request.first_ms, partial(self._prefilled, request))
        self._at(request.first_ms + self.spec.decode_ms, partial(self._finished, request))
        if self.window[0] <= now <= self.window[1]:
            self.stats.sent(n, hit, self.spec.block_size, request.first_ms - now, self.in_flight)
            if self.seen is not None:
                self.stats.ceiling_tokens += self._ceiling(
                    session.keys[: n // self.spec.block_size], n
                )
            if spent is not None:
                self.stats.decision_ns.append(spent.wall_ns)
                self.stats.decision_cpu_ns.append(spent.cpu_ns)
                self.stats.digest_ns.append(spent.digest_ns)
                self.stats.hash_ns.append(spent.hash_ns)

    def _ceiling(self, keys: list[int], n: int) -> int:
        """The prompt tokens a fleet whose every engine held every block computed so far
        (caches without limit) would hold: no policy can do better."""
        assert self.seen is not None
        held = next((i for i, key in enumerate(keys) if key not in self.seen), len(keys))
        return min(held * self.spec.block_size, n - 1)

    def _computed(self, session: Session, tokens: int) -> None:
        """``session``'s first ``tokens`` were computed somewhere: the ceiling's caches hold
        their full blocks (round-robin's run only)."""
        if self.seen is not None:
            self.seen.update(session.keys[: tokens // self.spec.block_size])

    def _prefilled(self, request: SimRequest, now: float) -> None:
        self._computed(request.session, request.session.prompt_ends[request.round])
        self.engines[request.engine].prefilled(request)
        self.queued[request.engine] -= request.queued

    def _finished(self, request: SimRequest, now: float) -> None:
        self._computed(request.session, request.session.answer_ends[request.round])
        self.engines[request.engine].finish(request)
        self.in_flight[request.engine] -= 1
        session, next_round = request.session, request.round + 1
        if next_round < session.rounds:
            wait = session.think_ms[next_round - 1]
            self._at(now + wait, partial(self._send, session, next_round))

    def _route(self, session: Session, n: int) -> tuple[int, int, Spent | None]:
        """(the engine, the prompt tokens the policy expects it to hold, the decision's time)."""
        if self.policy == "kv-aware":
            return self._kv_aware(session.tokens[:n])
        if self.policy == ORACLE:
            return self._oracle(session.keys[: n // self.spec.block_size]), 0, None
        loads = Loads(self.in_flight, self.queued, self.recent)
        decision = choose(self.policy, loads, n, self.spec.block_size, self.turn)
        self.turn += 1
        return decision.index, 0, None

    def _kv_aware(self, tokens: list[int]) -> tuple[int, int, Spent]:
        """As ``Placement.choose`` (every engine up, its index exact)."""
        index = self.index
        assert index is not None
        cpu = time.thread_time_ns()
        started = time.perf_counter_ns()
        block_size = index.block_size
        cached = None  # no event yet: no index
        if block_size:
            cached = Held(index.prompt_stretches(tokens, self.positions), self.positions)
        loads = Loads(self.in_flight, self.queued, self.recent)
        decision = choose("kv-aware", loads, len(tokens), block_size or 1, self.turn, cached)
        wall, cpu_ns = time.perf_counter_ns() - started, time.thread_time_ns() - cpu
        hashed = time.perf_counter_ns()
        index.digests(tokens)  # alone, every block, apart from the decision
        digested = time.perf_counter_ns()
        hash(tuple(tokens))  # every token once, in C: less than any router keyed by tokens does
        spent = Spent(wall, cpu_ns, digested - hashed, time.perf_counter_ns() - digested)
        self.turn += 1
        self.recent = array("d", map(DECAY.__mul__, self.recent))
        self.recent[decision.index] += 1.0
        return decision.index, decision.cached_tokens, spent

    def _oracle(self, keys: list[int]) -> int:
        """The engine holding the longest prefix of ``keys``, among those the load bound lets
        take it (``scoring.LOAD_BOUND``, as ``kv-aware``); ties to the fewest in flight."""
        assert self.holders is not None
        n, turn = len(self.engines), self.turn
        self.turn += 1
        mean = (sum(self.in_flight) + 1) / n
        bound = max(LOAD_BOUND * mean, mean + 1) - 1
        longest = {i for i in range(n) if self.in_flight[i] <= bound}
        for key in keys:
            held = longest & self.holders.get(key, set())
            if not held:
                break
            longest = held
        return min(longest, key=lambda i: (self.in_flight[i], (i - turn) % n))

    def _row(self, seconds: float) -> dict[str, Any]:
        stats, n = self.stats, len(self.engines)
        decisions = sorted(stats.decision_ns)
        return {
            "engines": n,
            "policy": self.policy,
            "sessions": len(self.arrivals),
            "requests": len(stats.ttft),
            "prompt_tokens": stats.prompt_tokens,
            "hit_rate": round(stats.cached_tokens / max(1, stats.prompt_tokens), 4),
            "ceiling_hit_rate": (
                round(stats.ceiling_tokens / max(1, stats.prompt_tokens), 4)
                if self.seen is not None
                else None
            ),
            "gpu_share": round(stats.gpu_tokens / max(1, stats.cached_tokens), 4),
            "imbalance": round(sum(stats.imbalance) / max(1, len(stats.imbalance)), 3),
            "in_flight_mean": round(stats.in_flight_sum / max(1, len(stats.imbalance)) / n, 2),
            "ttft_p50_ms": round(percentile(sorted(stats.ttft), 0.5), 1),
            "ttft_p90_ms": round(percentile(sorted(stats.ttft), 0.9), 1),
            "decision_us_p50": round(percentile(decisions, 0.5) / 1e3, 1) if decisions else None,
            "decision_us_p99": round(percentile(decisions, 0.99) / 1e3, 1) if decisions else None,
            "digest_us_p99": (
                round(percentile(sorted(stats.digest_ns), 0.99) / 1e3, 1) if decisions else None
            ),
            "hash_us_p99": (
                round(percentile(sorted(stats.hash_ns), 0.99) / 1e3, 1) if decisions else None
            ),
            "decision_cpu_us_p99": (
                round(percentile(sorted(stats.decision_cpu_ns), 0.99) / 1e3, 1)
                if decisions
                else None
            ),
            "index_blocks": stats.index_blocks if self.index is not None else None,
            "index_hashes": stats.index_hashes if self.index is not None else None,
            "index_bytes_per_block": (
                round(stats.index_bytes / stats.index_blocks) if stats.index_blocks else None
            ),
            "gpu_overflow_blocks": max(engine.overflow for engine in self.engines),
            "sim_s": round(seconds, 2),
        }
