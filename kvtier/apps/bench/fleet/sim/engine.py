"""One engine of ``kvtier bench fleet``'s simulated fleet: its two caches, its prefill queue, and
the KV events it publishes, as vLLM with kvtier would.

    SimEngine(number, spec, holders, publish)
    cached(keys)          -> Hit     the leading blocks it could serve now, by tier
    admit(request, now)   -> Hit     pin the prompt's blocks, queue its prefill (request.first_ms)
    prefilled(request)               the blocks it computed or loaded are cached: STORED "GPU"
    finish(request)                  the answer's full blocks cached too; every full block of the
                                     request stored in the host tier (STORED "CPU"); pins let go
    check_integrity()                AssertionError if its caches contradict each other

The GPU prefix cache is an LRU of full blocks (``gpu_blocks``): a running request's blocks are
pinned; when it finishes they stay cached, its last block the first to go (vLLM frees a
request's blocks tail first). A block being computed is not yet a hit for another request. The
host tier (kvtier's) is an LRU of ``cpu_blocks``. Every change is published as the engine
would (``Event(Kind.STORED | Kind.REMOVED, ..., medium)``), under hashes of the engine's own (the
simulator's key mixed with a per-engine salt): the index maps them to tokens itself.

Time: prompts are computed at ``prefill_per_ms`` tokens per ms, one request's prefill after
another (FIFO); a token loaded from a tier costs its ``scoring.WEIGHTS`` fraction of one
computed; the request then decodes for ``decode_ms``, beside the others. ``holders`` (key ->
engines; None: not kept) is the truth the oracle routes by: who could serve a block now.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from kvtier.apps.bench.fleet.sim.trace import Session
from kvtier.apps.proxy.kv_events import Event, Kind
from kvtier.apps.proxy.scoring import WEIGHTS

MASK = (1 << 64) - 1


@dataclass(frozen=True)
class EngineSpec:
    # an engine's ~80 live sessions hold ~3,600 blocks of their own (more with those just
    # ended) and share 4 x 32 of system prompts: about its GPU cache, well within GPU + host,
    # and far less than every session of the fleet (what round-robin needs each engine to hold)
    gpu_blocks: int = 4096
    cpu_blocks: int = 16384
    prefill_per_ms: float = 10.0  # prompt tokens computed per ms
    decode_ms: float = 2000.0
    block_size: int = 16


class Hit(NamedTuple):
    gpu: int  # leading blocks ready in the engine's memory
    cpu: int  # leading blocks found in the host tier only


@dataclass
class SimRequest:
    session: Session
    round: int
    sent_ms: float
    engine: int
    queued: int  # prompt tokens the proxy counts in the engine's queue until it is prefilled
    first_ms: float = 0.0  # when its first token is out
    allocated: list[int] = field(default_factory=list)  # blocks it computes or loads (indices)

    @property
    def prompt_tokens(self) -> int:
        return self.session.prompt_ends[self.round]


class SimEngine:
    def __init__(
        self,
        number: int,
        spec: EngineSpec,
        holders: dict[int, set[int]] | None,
        publish: Callable[[list[Event]], object] | None,
    ) -> None:
        self.number = number
        self.spec = spec
        self.holders = holders
        self.publish = publish
        self.salt = random.Random(number).getrandbits(64)
        self.gpu: OrderedDict[int, None] = OrderedDict()  # unpinned cached blocks, oldest first
        self.pins: dict[int, int] = {}  # blocks running requests hold -> how many hold each
        self.computing: set[int] = set()  # pinned blocks not computed (or loaded) yet
        self.cpu: OrderedDict[int, None] = OrderedDict()  # the host tier, oldest first
        self.free_at = 0.0  # when its queued prefills are done
        self.overflow = 0  # most blocks pinned past gpu_blocks (0: the pins always fitted)

    def cached(self, keys: list[int]) -> Hit:
        gpu = cpu = 0
        for key in keys:
            if key in self.gpu or (key in self.pins and key not in self.computing):
                gpu += 1
            elif key in self.cpu:
                cpu += 1
            else:
                break
        return Hit(gpu, cpu)

    def admit(self, request: SimRequest, now: float) -> Hit:
        spec, session = self.spec, request.session
        n = request.prompt_tokens
        keys = session.keys[: n // spec.block_size]
        hit = self.cached(keys)
        blocks = hit.gpu + hit.cpu
        cached = min(blocks * spec.block_size, n - 1)
        loaded = hit.cpu * spec.block_size * cached / (blocks * spec.block_size) if blocks else 0
        work = n - cached + WEIGHTS["CPU"] * loaded
        request.first_ms = max(now, self.free_at) + work / spec.prefill_per_ms
        self.free_at = request.first_ms
        pins, gpu = self.pins, self.gpu
        for i, key in enumerate(keys):
            count = pins.get(key)
            if count is not None:
                pins[key] = count + 1
            elif key in gpu:
                del gpu[key]
                pins[key] = 1
            else:
                pins[key] = 1
                self.computing.add(key)
                request.allocated.append(i)
        self._removed(self._trim(), "GPU")
        return hit

    def prefilled(self, request: SimRequest) -> None:
        keys = [request.session.keys[i] for i in request.allocated]
        self.computing.difference_update(keys)
        self._hold(keys)
        self._stored(request.session, request.allocated, "GPU")

    def finish(self, request: SimRequest) -> None:
        session, spec = request.session, self.spec
        full = session.answer_ends[request.round] // spec.block_size
        pinned = request.prompt_tokens // spec.block_size
        keys = session.keys[:full]
        pins, gpu = self.pins, self.gpu
        answered: list[int] = []
        for i in range(full - 1, pinned - 1, -1):  # the tail first into the LRU: the first to go
            key = keys[i]
            if key in gpu:
                gpu.move_to_end(key)
            elif key not in pins:
                gpu[key] = None
                answered.append(i)
        for i in range(pinned - 1, -1, -1):
            key = keys[i]
            count = pins[key] - 1
            if count:
                pins[key] = count
            else:
                del pins[key]
                gpu[key] = None
        answered.reverse()
        self._hold([keys[i] for i in answered])
        self._stored(session, answered, "GPU")  # before the removals: some may be of these
        self._removed(self._trim(), "GPU")
        self._store_host(session, keys)

    def check_integrity(self) -> None:
        assert all(count > 0 for count in self.pins.values()), "a pin count below 1"
        assert not self.gpu.keys() & self.pins.keys(), "a block both pinned and free"
        assert self.computing <= self.pins.keys(), "a block computed without a pin"
        assert len(self.cpu) <= self.spec.cpu_blocks, "the host tier over its capacity"
        used = len(self.gpu) + len(self.pins)
        assert used <= max(self.spec.gpu_blocks, len(self.pins)), "the GPU cache over capacity"
        if self.holders is not None:
            held = {key for key, engines in self.holders.items() if self.number in engines}
            ready = (self.gpu.keys() | self.pins.keys()) - self.computing
            assert held == ready | self.cpu.keys(), "the oracle's truth is not the caches'"

    def _store_host(self, session: Session, keys: list[int]) -> None:
        cpu, new = self.cpu, []
        for i in range(len(keys) - 1, -1, -1):  # the prefix the most recent
            key = keys[i]
            if key in cpu:
                cpu.move_to_end(key)
            else:
                cpu[key] = None
                new.append(i)
        new.reverse()
        self._hold([keys[i] for i in new])
        evicted = []
        while len(cpu) > self.spec.cpu_blocks:
            key, _ = cpu.popitem(last=False)
            evicted.append(key)
            if key not in self.gpu and (key not in self.pins or key in self.computing):
                self._unhold(key)
        self._stored(session, new, "CPU")
        self._removed(evicted, "CPU")

    def _trim(self) -> list[int]:
        """Evict the least recent unpinned blocks past ``gpu_blocks``; those evicted."""
        gpu, capacity = self.gpu, self.spec.gpu_blocks - len(self.pins)
        evicted: list[int] = []
        while len(gpu) > capacity and gpu:
            key, _ = gpu.popitem(last=False)
            evicted.append(key)
            if key not in self.cpu:
                self._unhold(key)
        self.overflow = max(self.overflow, -capacity)
        return evicted

    def _hold(self, keys: list[int]) -> None:
        if self.holders is not None:
            for key in keys:
                self.holders.setdefault(key, set()).add(self.number)

    def _unhold(self, key: int) -> None:
        if self.holders is not None:
            engines = self.holders[key]
            engines.discard(self.number)
            if not engines:
                del self.holders[key]

    def _hash(self, key: int) -> int:
        return (key ^ self.salt) & MASK

    def _stored(self, session: Session, indices: list[int], medium: str) -> None:
        """Publish the blocks at ``indices`` (ascending): one event per consecutive run."""
        if self.publish is None or not indices:
            return
        size, keys, events = self.spec.block_size, session.keys, []
        start = 0
        for pos in range(1, len(indices) + 1):
            if pos < len(indices) and indices[pos] == indices[pos - 1] + 1:
                continue
            first, last = indices[start], indices[pos - 1] + 1
            hashes = tuple(self._hash(key) for key in keys[first:last])
            parent = self._hash(keys[first - 1]) if first else None
            tokens = tuple(session.tokens[first * size : last * size])
            events.append(Event(Kind.STORED, hashes, parent, tokens, size, medium))
            start = pos
        self.publish(events)

    def _removed(self, keys: list[int], medium: str) -> None:
        if self.publish is not None and keys:
            hashes = tuple(self._hash(key) for key in keys)
            self.publish([Event(Kind.REMOVED, hashes, medium=medium)])
