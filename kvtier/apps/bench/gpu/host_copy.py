"""Host-tier stores and loads of the request, as the connector makes them, against one copy.

    HostRig(shape, tokens, device, mechanisms=None)
                                     the shape's engine, the request, a host tier twice its
                                     size (pinned before anything is timed, on CUDA), and per
                                     mechanism (None: every one the device has) a
                                     ``TransferWorker`` with the engine <-> host handlers
                                     registered as the worker connector registers them
    .submit(mechanism, store)        queue one job of the request (returns its id)
    .finish(mechanism, ids)          wait for those jobs; RuntimeError unless all succeeded
    .run(mechanism, store)           ``submit`` one job and wait for its copies (not for its
                                     report: ``collect``)
    .collect(mechanism)              ``finish`` the jobs ``run`` left
    .records()                       each chunk's record in the host tier, in key order
    .loaded_intact()                 whether the target blocks hold the request's pages
    measure(rig, reps, clock)        host_store_ratio and host_load_ratio per mechanism
    queued_submits(rig, mechanism, jobs)
                                     each store's submit, submitted back to back

Mechanisms: on CUDA ``dma`` (a gather on the device, large copies on the copy engine) and
``kernel`` (the default: one Triton kernel straight to pinned host memory; DMA where Triton does
not run), each through ``engine_host_handlers`` as the connector builds them; on the CPU
``cpu`` (the copy lanes). The bound is one contiguous copy of the same bytes between pinned host
memory and device memory (``Bound``), timed back to back with each job, the order alternating
per rep; a figure is ``bound seconds / job seconds`` per rep (1.0: as fast as the one copy).
A job's seconds are its submit and its copies, until its event is done, as a forward fenced on a
load waits for it; its report (``get_finished``, which the connector polls once a step) comes
after the clock stops.
Stores copy the request's blocks into its slots; loads copy the slots into other blocks, which
are checked against the originals once after the reps.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection
from functools import partial

import numpy as np
import torch

from kvtier.addresses import TransferSpec
from kvtier.apps.bench.gpu import call_costs, plan_cost, submit_profile
from kvtier.apps.bench.gpu.clock import Clock
from kvtier.apps.bench.gpu.figures import Measured, ratios, summary
from kvtier.apps.bench.gpu.request import Request, engine_blocks_for, same_pages
from kvtier.apps.bench.gpu.shapes import Shape, build_engine
from kvtier.layout import KVLayout
from kvtier.media import Medium
from kvtier.pages import kernel
from kvtier.pages.mechanism import Mechanism
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io import engine_host_handlers
from kvtier.tiers.host.io.engine_host import EngineHostHandler
from kvtier.worker import TransferWorker

PIN_WAIT_S = 120.0  # the host tier must be pinned before anything is timed


def mechanisms(device: torch.device) -> tuple[str, ...]:
    return (Mechanism.DMA.value, Mechanism.KERNEL.value) if device.type == "cuda" else ("cpu",)


class HostRig:
    def __init__(
        self,
        shape: Shape,
        tokens: int,
        device: torch.device,
        only: tuple[str, ...] | None = None,
    ) -> None:
        self.shape = shape
        self.engine = build_engine(shape, engine_blocks_for(shape, tokens), device, seed=0)
        layout = self.engine.layout
        self.request = Request.of(shape, layout, tokens, seed=1)
        self.target = self.request.elsewhere(layout.num_blocks, seed=2)  # where loads land
        self.host = HostTier(layout, self.request.host_chunks, shape.factor)
        if self.host.pinning is not None and not self.host.pinning.wait(PIN_WAIT_S):
            raise RuntimeError(f"the host tier was not pinned within {PIN_WAIT_S:.0f} s")
        self.mechanisms = mechanisms(device) if only is None else only
        self.workers = {m: _worker(layout, self.host, m) for m in self.mechanisms}
        self._bound: Bound | None = None
        self.submit_s: dict[str, list[float]] = {m: [] for m in self.mechanisms}
        self.device_s: dict[str, list[float]] = {m: [] for m in self.mechanisms}  # per job
        self._ids = itertools.count()
        self._ran: dict[str, list[int]] = {m: [] for m in self.mechanisms}  # not yet finished

    def submit(self, mechanism: str, store: bool) -> int:
        """Queue a store (the request's blocks -> its slots) or a load (the slots -> the
        target blocks); the time the engine's thread spent submitting it is recorded."""
        job_id = next(self._ids)
        spec: tuple[TransferSpec, TransferSpec] = (self.request.engine, self.request.slots)
        if not store:
            spec = (self.request.slots, self.target)
        started = time.perf_counter()
        if not self.workers[mechanism].transfer_async(job_id, spec):
            raise RuntimeError(f"host {'store' if store else 'load'} job {job_id} refused")
        self.submit_s[mechanism].append(time.perf_counter() - started)
        return job_id

    def finish(self, mechanism: str, job_ids: Collection[int]) -> None:
        worker = self.workers[mechanism]
        worker.wait(job_ids)
        pending = set(job_ids)
        deadline = time.monotonic() + PIN_WAIT_S
        while pending and time.monotonic() < deadline:
            for result in worker.get_finished():
                if not result.success:
                    raise RuntimeError(f"host job {result.job_id} failed: {result}")
                pending.discard(result.job_id)
                self.device_s[mechanism].append(result.seconds)
            if pending:
                time.sleep(0.0005)
        if pending:
            raise RuntimeError(f"host jobs {sorted(pending)} never reported done")

    def move(self, mechanism: str, store: bool) -> None:
        self.finish(mechanism, [self.submit(mechanism, store)])

    def run(self, mechanism: str, store: bool) -> None:
        job_id = self.submit(mechanism, store)
        self.workers[mechanism].wait([job_id])
        self._ran[mechanism].append(job_id)

    def collect(self, mechanism: str) -> None:
        self.finish(mechanism, self._ran[mechanism])
        self._ran[mechanism].clear()

    @property
    def bound(self) -> Bound:
        if self._bound is None:
            self._bound = Bound(self.request.nbytes, self.engine.layout.device)
        return self._bound

    def records(self) -> list[np.ndarray]:
        slots = self.request.slots.slots.tolist()
        return [self.host.record(s, g) for s, g in zip(slots, self.request.chunk_groups)]

    def loaded_intact(self) -> bool:
        layout = self.engine.layout
        return same_pages(layout, self.target, layout, self.request.engine)

    def close(self) -> None:
        for worker in self.workers.values():
            worker.shutdown()
        self.host.close()


def _worker(layout: KVLayout, host: HostTier, mechanism: str) -> TransferWorker:
    store: EngineHostHandler
    load: EngineHostHandler
    if mechanism == "cpu":  # the connector's own pair: copy lanes on the CPU
        store, load = engine_host_handlers(layout, host)
    else:  # the connector's pair, by this mechanism (the connector's: ``gpu_mechanisms()``)
        store, load = engine_host_handlers(layout, host, mechanism=Mechanism(mechanism))
    worker = TransferWorker()
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    return worker


class Bound:
    """One contiguous copy of ``nbytes`` between pinned host memory and device memory."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.engine = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")

    def store(self) -> None:
        self.host.copy_(self.engine, non_blocking=True)

    def load(self) -> None:
        self.engine.copy_(self.host, non_blocking=True)


def measure(rig: HostRig, reps: int, clock: Clock) -> Measured:
    seconds: dict[str, list[float]] = {}
    on_device: dict[str, list[float]] = {}  # each job's, from its start on the device to its end
    for mechanism in rig.mechanisms:  # warm-up: the kernel's compilation, first touches
        rig.move(mechanism, store=True)
        rig.move(mechanism, store=False)
        rig.submit_s[mechanism].clear()
    rig.bound.store()
    rig.bound.load()
    for rep in range(reps):
        for mechanism in rig.mechanisms:
            for side, store in (("store", True), ("load", False)):
                bound = rig.bound.store if store else rig.bound.load
                job = partial(rig.run, mechanism, store)
                pair: list[tuple[str, Callable[[], object]]] = [
                    (f"bound_{side}_{mechanism}", bound),
                    (f"{side}_{mechanism}", job),
                ]
                for name, fn in pair if rep % 2 == 0 else pair[::-1]:
                    seconds.setdefault(name, []).append(clock.seconds(fn))
                rig.collect(mechanism)
                on_device.setdefault(f"{side}_{mechanism}", []).append(rig.device_s[mechanism][-1])
    if not rig.loaded_intact():
        raise RuntimeError("a host load brought back other bytes than the store copied")
    figures = {
        f"host_{side}_ratio": {m: ratios(seconds[f"bound_{side}_{m}"], seconds[f"{side}_{m}"])
                               for m in rig.mechanisms}
        for side in ("store", "load")
    }  # fmt: skip
    nbytes = rig.request.nbytes
    details = {
        "bytes": nbytes, "chunks": len(rig.request.slots.slots),
        "pinned": rig.host.pinned, "triton_kernel": kernel.available(),
        "grid_launch": kernel.launch_for(max(rig.host.records.page_bytes))._asdict(),
        "seconds": {name: summary(values) for name, values in seconds.items()},
        "gb_s": {name: round(nbytes / min(values) / 1e9, 2) for name, values in seconds.items()},
        "load_s": {m: [float(f"{v:.6g}") for v in seconds[f"load_{m}"]] for m in rig.mechanisms},
        "submit_ms": {m: summary([s * 1e3 for s in rig.submit_s[m]]) for m in rig.mechanisms
                      if rig.submit_s[m]},
        # the bound over a job's time on the device alone: what the submit on the calling
        # thread (``submit_ms``) costs the figure is the rest
        "device_ratio": {name: ratios(seconds[f"bound_{name}"], values)
                         for name, values in on_device.items()},
    }  # fmt: skip
    details["submit_ms_queued"] = {m: summary(queued_submits(rig, m, max(reps, 3)))
                                   for m in rig.mechanisms}  # fmt: skip
    details["plan_ms"] = plan_cost.measure(  # a store's planning on the engine's thread
        rig.engine.layout, rig.host, (rig.request.engine, rig.request.slots), reps
    )
    details["call_us"] = call_costs.measure(rig.engine.layout.device)  # CUDA's calls, each
    details["submit_profile"] = {
        f"{side}_{m}": submit_profile.top(partial(rig.move, m, side == "store"))
        for m in rig.mechanisms
        for side in ("store", "load")
    }
    if rig.engine.layout.device.type == "cuda" and not kernel.available():
        details["note"] = "Triton does not run here: the kernel mechanism moved pages by DMA"
    return Measured(figures, {}, details)


def queued_submits(rig: HostRig, mechanism: str, jobs: int) -> list[float]:
    """Milliseconds each of ``jobs`` stores took to submit, submitted back to back, each while
    the copies of the one before run (``submit_ms``: each after the device was idle)."""
    start = len(rig.submit_s[mechanism])
    rig.finish(mechanism, [rig.submit(mechanism, store=True) for _ in range(jobs)])
    return [s * 1e3 for s in rig.submit_s[mechanism][start:]]


def load_seconds(measured: Measured) -> dict[str, list[float]]:
    """Per mechanism, the load jobs' seconds of a ``measure`` (for ``hit_over_prefill``)."""
    loads: dict[str, list[float]] = measured.details["load_s"]
    return loads
