"""The processes of a chaos run, each one that may be started again on its port.

    Node(name, command, port, env, logs)   a server: .start(), .url, .pid, .server
    started_cluster(settings, logs, reuse_port) -> Cluster   (a context) Redis, the engines,
                                     the proxies, healthy, the fleet proxy's index exact;
                                     everything stopped on exit
    Cluster.node(name), .groups()    a node by name; every process group's leader, by name
    Cluster.restart_proxy()          a new fleet proxy on its port (``--reuse-port``: the new
                                     one serves before the old one drains, else one after the
                                     other)

The fleet: ``settings.engines`` kv_both engines (``engine-0``…), each with a host tier and the
shared Redis tier, behind ``proxy`` (``kvtier proxy --engine … --policy kv-aware``); with
``settings.pd``, ``prefill`` (kv_producer) and ``decode`` (kv_consumer), one transfer secret,
behind ``pd-proxy``. Every engine is pinned to a core (``taskset``, its OpenMP threads bound),
the cores taken in turn: as engines on machines of their own, on two.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.apps.bench.chaos.settings import ChaosSettings
from kvtier.apps.bench.common.models import model_dir
from kvtier.apps.bench.common.redis_server import RedisServer
from kvtier.apps.bench.common.servers import (
    KVTIER,
    WAIT_S,
    WORKER_IN_CORE,
    Server,
    healthy,
    launch,
    serve_command,
    stop,
    wait,
    wait_healthy,
)
from kvtier.apps.bench.fleet.real.fleet import index_modes
from kvtier.apps.ports import free_port

HOST_BYTES = "64MiB"  # each engine's host tier
ENGINE_BLOCKS = 160  # each engine's own cache, in blocks of 32 tokens: less than the workload
MAX_MODEL_LEN = 2048
REDIS_MEMORY = "256mb"
SETTLE_S = 2.0  # a new proxy beside the old one, before the old one drains
# each engine's /health every 0.5 s, stalled when unanswered in 1 s: a stall found within 1.5 s
WATCH = ("--health-interval-s", "0.5", "--health-timeout-s", "1")


@dataclass
class Node:
    """One server: its command, port and environment kept, to be started again alike."""

    name: str
    command: list[str]
    port: int
    env: dict[str, str]
    logs: Path
    server: Server | None = None
    starts: int = 0

    def start(self) -> Server:
        """Launched (not waited for); its log ``<name>-<n>.log``, n its starts so far."""
        log = self.logs / f"{self.name}-{self.starts}.log"
        self.server = launch(self.command, self.port, log, self.env)
        self.starts += 1
        return self.server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process group's leader, while it runs."""
        if self.server is None or self.server.process.poll() is not None:
            return None
        return self.server.process.pid


@dataclass
class Cluster:
    redis: RedisServer
    engines: list[Node]
    proxy: Node
    pair: list[Node] = field(default_factory=list)  # prefill, decode
    pd_proxy: Node | None = None

    def node(self, name: str) -> Node:
        nodes = {n.name: n for n in [*self.engines, *self.pair, self.proxy]}
        if name not in nodes:
            raise ValueError(f"no node {name!r}; the nodes: {', '.join(nodes)}")
        return nodes[name]

    def groups(self) -> dict[str, int]:
        """Every running process group's leader pid, by name (Redis as ``redis``)."""
        nodes = [*self.engines, *self.pair, self.proxy, *([self.pd_proxy] if self.pd_proxy else [])]
        found = {n.name: n.pid for n in nodes} | {"redis": self.redis.pid}
        return {name: pid for name, pid in found.items() if pid is not None}

    def restart_proxy(self, reuse_port: bool) -> None:
        old = self.proxy.server
        if old is not None and not reuse_port:
            stop(old)
        new = self.proxy.start()
        wait_healthy(new)
        if old is not None and reuse_port:
            time.sleep(SETTLE_S)  # the new one accepting beside the old one
            stop(old)
        _wait_exact(self.proxy, len(self.engines))


def proxy_reuses_ports() -> bool:
    """Whether ``kvtier proxy`` has ``--reuse-port`` (a new proxy on a port the old one holds)."""
    done = subprocess.run([KVTIER, "proxy", "--help"], capture_output=True, text=True,
                          timeout=WAIT_S)  # fmt: skip
    return "--reuse-port" in done.stdout


@contextmanager
def started_cluster(settings: ChaosSettings, logs: Path, reuse_port: bool) -> Iterator[Cluster]:
    """``reuse_port``: the fleet proxy started with ``--reuse-port`` (``proxy_reuses_ports``)."""
    model = model_dir(settings.model)
    cores = sorted(os.sched_getaffinity(0))
    reuse = ["--reuse-port"] if reuse_port else []
    with ExitStack() as stack:
        redis = RedisServer(maxmemory=REDIS_MEMORY, maxmemory_policy="allkeys-lru")
        stack.enter_context(redis)
        extra = {"cpu_bytes_to_use": HOST_BYTES, "redis": {"url": redis.url}}
        engines = [_engine(f"engine-{i}", model, extra, cores[i % len(cores)], logs, {})
                   for i in range(settings.engines)]  # fmt: skip
        pair: list[Node] = []
        if settings.pd:
            secret = {"KVTIER_TRANSFER_SECRET": secrets.token_hex(16)}
            for i, (name, role) in enumerate(
                (("prefill", "kv_producer"), ("decode", "kv_consumer"))
            ):
                node = _engine(name, model, {"cpu_bytes_to_use": HOST_BYTES}, cores[i % len(cores)],
                               logs, secret, ["--kv-role", role])  # fmt: skip
                pair.append(node)
        for node in [*engines, *pair]:
            stack.callback(_stop, node)
            node.start()
        wait_healthy(*(n.server for n in [*engines, *pair] if n.server is not None))
        fleet = [KVTIER, "proxy", "--engine", *(e.url for e in engines), "--policy", "kv-aware",
                 *WATCH, *reuse]  # fmt: skip
        proxy = _proxy("proxy", fleet, logs)
        stack.callback(_stop, proxy)
        pd_proxy: Node | None = None
        if pair:
            sides = ["--prefill", pair[0].url, "--decode", pair[1].url]
            pd_proxy = _proxy("pd-proxy", [KVTIER, "proxy", *sides, *WATCH], logs)
            stack.callback(_stop, pd_proxy)
        for started in (proxy, pd_proxy):
            if started is not None:
                wait_healthy(started.start())
        _wait_exact(proxy, len(engines))
        yield Cluster(redis, engines, proxy, pair, pd_proxy)


def _engine(
    name: str,
    model: Path,
    extra: Mapping[str, object],
    core: int,
    logs: Path,
    env: dict[str, str],
    args: tuple[str, ...] | list[str] = (),
) -> Node:
    port = free_port()
    command = serve_command(model, port, extra, ["--num-gpu-blocks-override", str(ENGINE_BLOCKS),
                                                 *args], "float32", MAX_MODEL_LEN)  # fmt: skip
    bound = {"VLLM_CPU_OMP_THREADS_BIND": str(core), **WORKER_IN_CORE, **env}
    return Node(name, ["taskset", "-c", str(core), *command], port, bound, logs)


def _proxy(name: str, command: list[str], logs: Path) -> Node:
    port = free_port()
    return Node(name, [*command, "--port", str(port)], port, {}, logs)


def _wait_exact(proxy: Node, engines: int) -> None:
    """Until the fleet proxy follows every engine's events (a bounded wait)."""
    server = proxy.server
    assert server is not None
    wait(lambda: healthy(server) and index_modes(server) == ["exact"] * engines, WAIT_S,
         f"{proxy.name}'s index of every engine")  # fmt: skip


def _stop(node: Node) -> None:
    if node.server is not None:
        stop(node.server)
