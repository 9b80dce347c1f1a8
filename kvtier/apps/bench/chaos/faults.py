"""The chaos run's faults, done to the cluster one at a time, each one's timeline recorded.

    FaultEvent(kind, target, url, start_s, end_s, hold_s, done, note)   one fault as it went
    Injector(cluster, planned, settings, clock, reuse_port)   a thread: the plan, in order
        .events                   the faults done so far (``done`` False: it could not be
                                  finished; ``note`` says why, and no fault follows it)
        .stop()                   no more faults; a stalled process is resumed first

A fault starts after its quiet gap, counted from the previous one's end, and only while at least
``settings.after_s`` of the run remain (its aftermath is measured). Its end is when the part is
back: an engine killed and started again on its port answers /health; a stopped process is
continued; Redis killed answers again, empty; the fleet proxy restarted follows every engine's
events; an engine's caches reset answers ``success``.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.apps.bench.chaos.cluster import Cluster
from kvtier.apps.bench.chaos.schedule import FaultKind, PlannedFault
from kvtier.apps.bench.chaos.settings import ChaosSettings
from kvtier.apps.bench.common.servers import START_S, wait_healthy
from kvtier.apps.bench.fleet.real.fleet import reset_caches


@dataclass
class FaultEvent:
    kind: str  # a FaultKind's value
    target: str  # "engine-0", "prefill", "redis", "proxy"
    url: str  # the target's ("" for Redis)
    start_s: float  # on the run's clock
    end_s: float = 0.0
    hold_s: float = 0.0  # a stop's planned length
    done: bool = True
    note: str = ""


class Injector(threading.Thread):
    def __init__(
        self,
        cluster: Cluster,
        planned: list[PlannedFault],
        settings: ChaosSettings,
        clock: Callable[[], float],
        reuse_port: bool,
    ) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.cluster, self.planned, self.settings = cluster, planned, settings
        self.clock, self.reuse_port = clock, reuse_port
        self.events: list[FaultEvent] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        last_start = self.settings.duration_s - self.settings.after_s
        for fault in self.planned:
            if self.stopping.wait(fault.gap_s) or self.clock() > last_start:
                return
            url = "" if fault.target == "redis" else self._url(fault.target)
            event = FaultEvent(fault.kind.value, fault.target, url, round(self.clock(), 3),
                               hold_s=fault.hold_s)  # fmt: skip
            self.events.append(event)
            try:
                self._do(fault)
            except (AssertionError, OSError, RuntimeError) as error:  # the part did not come back
                event.done, event.note = False, f"{type(error).__name__}: {error}"[:500]
            event.end_s = round(self.clock(), 3)
            if not event.done:
                return

    def stop(self) -> None:
        self.stopping.set()
        self.join()

    def _url(self, target: str) -> str:
        return self.cluster.node(target).url

    def _do(self, fault: PlannedFault) -> None:
        redis = self.cluster.redis
        if fault.kind is FaultKind.ENGINE_KILL:
            self._kill_and_start(fault.target)
        elif fault.kind is FaultKind.ENGINE_STOP:
            self._stall(lambda how: os.killpg(self._pid(fault.target), how), fault.hold_s)
        elif fault.kind is FaultKind.REDIS_KILL:
            redis.restart()
        elif fault.kind is FaultKind.REDIS_STOP:
            self._stall(redis.send, fault.hold_s)
        elif fault.kind is FaultKind.PROXY_RESTART:
            self.cluster.restart_proxy(self.reuse_port)
        elif fault.kind is FaultKind.HOST_RESET:
            server = self.cluster.node(fault.target).server
            assert server is not None
            reset_caches([server], step=False)

    def _pid(self, target: str) -> int:
        pid = self.cluster.node(target).pid
        if pid is None:
            raise RuntimeError(f"{target} is not running")
        return pid

    def _kill_and_start(self, target: str) -> None:
        node = self.cluster.node(target)
        assert node.server is not None
        os.killpg(self._pid(target), signal.SIGKILL)
        node.server.process.wait(timeout=START_S)
        wait_healthy(node.start())

    def _stall(self, send: Callable[[signal.Signals], None], hold_s: float) -> None:
        """SIGSTOP, ``hold_s`` (shorter when the run stops), SIGCONT, whatever happens."""
        send(signal.SIGSTOP)
        try:
            self.stopping.wait(hold_s)
        finally:
            send(signal.SIGCONT)
