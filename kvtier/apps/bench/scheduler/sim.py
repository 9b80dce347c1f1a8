"""A tiny engine driving the scheduler half, step by step, as vLLM 0.32 would (no vLLM needed).

Each step, in vLLM's order: the workers report the jobs planned ``report_delay`` steps ago;
requests out of tokens finish (a held one keeps its blocks until kvtier lets them go); every
``preempt_every`` steps the youngest running request is preempted (its blocks freed, resumed
next step with a whole table); arrivals fill the running set (lookup, allocation, ``on_alloc``,
a whole prefill); every other running request decodes one token (a new block every
``block_tokens`` tokens; a sliding-window group frees the blocks left of its window first, in
place, as vLLM does); then ``build_plan`` with each request's new blocks (or, with
``whole_tables``, every request's whole table each step, as kvtier's adapter once did).

Block ids come from a LIFO free list, so freed blocks are reused at once (stores in flight must
be flushed). Hashes are integers as bytes; arrivals share a prompt prefix (hits).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtier.addresses import NULL_BLOCK
from kvtier.scheduler.connector import SchedulerConnector
from kvtier.scheduler.scheduled import ScheduledRequest, StepRequests
from kvtier.step_plan import JobOutcome, StepPlan, WorkerReport

PHASES = ("admit", "plan", "report", "finish")  # the scheduler half's calls, timed apart


@dataclass(frozen=True)
class Workload:
    running: int = 256  # requests kept running
    context: int = 4096  # prompt tokens of the first requests
    prompt: int = 2048  # prompt tokens of later arrivals: ``shared`` of them a common prefix
    shared: int = 1024
    decode: tuple[int, int] = (64, 512)  # tokens each request generates, at random in this range
    preempt_every: int = 0  # steps between preemptions (0: none)
    report_delay: int = 1  # steps before the workers report a job
    seed: int = 0


@dataclass
class _Request:
    req_id: str
    uid: int
    tokens: int  # known (prompt + sampled)
    budget: int  # tokens still to generate
    tables: list[list[int]]
    hashes: list[bytes] = field(default_factory=list)  # the engine's list: it grows in place
    computed: int = 0


@dataclass(frozen=True)
class Scheduled:
    """One request a step runs, as the engine sees it."""

    req_id: str
    new: list[list[int]]  # blocks allocated this step, per group (the whole table when ``whole``)
    tables: list[list[int]]  # the whole table, per group (the engine's own lists)
    computed: int  # tokens computed before the step
    tokens: int  # tokens the step computes
    whole: bool  # scheduled for the first time, or resumed
    resumed: bool  # resumed after a preemption


Adapter = Callable[[list[Scheduled]], Callable[[], StepRequests]]


@dataclass
class StepRecord:
    seconds: dict[str, float]  # per phase
    bound: float  # a bare loop touching each scheduled request's new block ids once
    plan: StepPlan
    scheduled: int  # requests the step ran
    new_blocks: int


class EngineSim:
    def __init__(
        self,
        connector: SchedulerConnector,
        workload: Workload,
        whole_tables: bool = False,
        adapter: Adapter | None = None,
    ) -> None:
        """``adapter``: makes the engine's step output (untimed) and returns the call, timed,
        that reads it (e.g. vLLM's ``SchedulerOutput``, read as ``StepRequests``)."""
        self.connector = connector
        self.work = workload
        self.whole_tables = whole_tables
        self.adapter = adapter
        self.block_tokens = connector.block_tokens
        self.windows = [g.sliding_window for g in connector.groups]
        self.rng = random.Random(workload.seed)
        self._free: list[int] = []
        self._next_block = NULL_BLOCK + 1
        self._next_uid = 0
        self.running: list[_Request] = []
        self.waiting: deque[_Request] = deque()  # preempted, resumed next step
        self.held: dict[str, _Request] = {}  # finished, blocks kept for their stores
        self._pending: deque[list[int]] = deque([[] for _ in range(workload.report_delay)])
        self.preemptions = 0

    # ---- blocks ----------------------------------------------------------------------------

    def _block(self) -> int:
        if self._free:
            return self._free.pop()
        self._next_block += 1
        return self._next_block - 1

    def _release(self, request: _Request) -> None:
        for table in request.tables:
            self._free += [b for b in reversed(table) if b != NULL_BLOCK]
            table.clear()

    def _grow(self, request: _Request, num_tokens: int) -> list[list[int]]:
        """Null what the windows left (as of ``request.computed``), then give ``num_tokens``
        slots: the new blocks per group."""
        new: list[list[int]] = []
        for table, window in zip(request.tables, self.windows, strict=True):
            if window is not None:
                skipped = max(0, request.computed - window + 1) // self.block_tokens
                for i in range(min(skipped, len(table)) - 1, -1, -1):
                    if table[i] == NULL_BLOCK:
                        break
                    self._free.append(table[i])
                    table[i] = NULL_BLOCK
            need = -(-num_tokens // self.block_tokens) - len(table)
            blocks = [self._block() for _ in range(max(0, need))]
            table += blocks
            new.append(blocks)
        return new

    def _hash(self, request: _Request, block: int) -> bytes:
        shared = block < self.work.shared // self.block_tokens
        return (block if shared else (request.uid + 1) << 32 | block).to_bytes(8, "little")

    def _know(self, request: _Request) -> None:
        """The engine hashes every full block of known tokens."""
        for block in range(len(request.hashes), request.tokens // self.block_tokens):
            request.hashes.append(self._hash(request, block))

    # ---- one step ----------------------------------------------------------------------------

    def step(self) -> StepRecord:
        seconds = dict.fromkeys(PHASES, 0.0)
        connector = self.connector
        done = self._pending.popleft() if self.work.report_delay else []
        started = time.perf_counter()
        for job_id in done:
            connector.on_report(WorkerReport({job_id: JobOutcome(ranks=1, bytes=1)}))
        seconds["report"] = time.perf_counter() - started
        seconds["finish"] = self._finish()
        preempted = self._preempt()
        scheduled: list[Scheduled] = []
        for request in self.running:
            if request.computed:  # decodes one token
                new = self._grow(request, request.computed + 1)
                scheduled.append(_scheduled(request, new, whole=False, resumed=False))
        seconds["admit"] = self._admit(scheduled)
        convert = self.adapter(scheduled) if self.adapter is not None else None
        started = time.perf_counter()
        requests: StepRequests | list[ScheduledRequest]
        if convert is not None:
            requests = convert()
        else:
            requests = [self._request(s) for s in scheduled]
        plan = connector.build_plan(requests, preempted)
        seconds["plan"] = time.perf_counter() - started
        bound = _bound(scheduled)
        jobs = [j.job_id for j in plan.loads] + [j.job_id for j in plan.stores]
        jobs += [j.job_id for j in plan.tier_writes]
        jobs = list(dict.fromkeys(jobs))  # a step's stores: one job of several parts
        if self.work.report_delay:
            self._pending.append(jobs)
        else:
            for job_id in jobs:
                connector.on_report(WorkerReport({job_id: JobOutcome(ranks=1, bytes=1)}))
        by_id = {r.req_id: r for r in self.running}
        for item in scheduled:
            request = by_id[item.req_id]
            request.computed = request.tokens
            request.tokens += 1  # the token it samples
            request.budget -= 1
            self._know(request)
        new_blocks = sum(len(ids) for item in scheduled for ids in item.new)
        return StepRecord(seconds, bound, plan, len(scheduled), new_blocks)

    def _request(self, item: Scheduled) -> ScheduledRequest:
        computed = item.computed + item.tokens
        if item.whole or self.whole_tables:  # the whole table, copied as the engine hands it
            tables = [list(table) for table in item.tables]
            return ScheduledRequest(item.req_id, tables, computed, item.tokens)
        return ScheduledRequest(item.req_id, item.new, computed, item.tokens, True)

    def _finish(self) -> float:
        connector, seconds = self.connector, 0.0
        for req_id in [r for r in self.held if r not in connector.requests]:
            self._release(self.held.pop(req_id))
        for request in [r for r in self.running if r.budget <= 0]:
            self.running.remove(request)
            started = time.perf_counter()
            held = connector.request_finished(request.req_id)
            seconds += time.perf_counter() - started
            if held:
                self.held[request.req_id] = request
            else:
                self._release(request)
        return seconds

    def _preempt(self) -> list[str]:
        every = self.work.preempt_every
        if not every or self.rng.randrange(every) or not self.running:
            return []
        request = self.running.pop()
        self._release(request)
        request.computed = 0
        self.waiting.append(request)
        self.preemptions += 1
        return [request.req_id]

    def _admit(self, scheduled: list[Scheduled]) -> float:
        """Resume the preempted, then start new requests up to ``running``; seconds in kvtier."""
        seconds = 0.0
        while len(self.running) < self.work.running:
            resumed = bool(self.waiting)
            request = self.waiting.popleft() if resumed else self._new_request()
            connector = self.connector
            started = time.perf_counter()
            hit = connector.lookup(request.req_id, request.hashes, 0) or 0
            seconds += time.perf_counter() - started
            request.computed = min(hit, request.tokens - 1)  # the engine computes the last one
            self._grow(request, request.tokens)
            started = time.perf_counter()
            connector.on_alloc(request.req_id, request.tables, request.computed)
            seconds += time.perf_counter() - started
            self.running.append(request)
            scheduled.append(_scheduled(request, request.tables, whole=True, resumed=resumed))
        return seconds

    def _new_request(self) -> _Request:
        first = self._next_uid < self.work.running
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        tokens = self.work.context + self.rng.randrange(64) if first else self.work.prompt
        request = _Request(
            f"req-{uid}",
            uid,
            tokens,
            self.rng.randint(*self.work.decode),
            [[] for _ in self.windows],
        )
        self._know(request)
        return request


def _scheduled(request: _Request, new: list[list[int]], whole: bool, resumed: bool) -> Scheduled:
    return Scheduled(
        request.req_id,
        new,
        request.tables,
        request.computed,
        request.tokens - request.computed,
        whole,
        resumed,
    )


def _bound(scheduled: list[Scheduled]) -> float:
    """Seconds of a bare loop touching each new block id of the step once."""
    started = time.perf_counter()
    for item in scheduled:
        for ids in item.new:
            for _ in ids:
                pass
    return time.perf_counter() - started
