"""Real Redis servers on 127.0.0.1 for the tests and the benchmarks: one, or a 3-master cluster.

    with RedisServer(maxmemory="2mb") as server:   redis-server on a free port, no persistence
        server.url                                 redis://127.0.0.1:PORT/0
        server.kill(); server.restart()            SIGKILL; a fresh server on the same port
        server.send(signal.SIGSTOP), server.pid    a signal to its process group; its pid
    with RedisServer(tls=True) as server:          a TLS-only port, its own CA
        server.url, server.ca_file                 rediss://127.0.0.1:PORT/0, the CA's PEM
    with RedisClusterServers(3) as cluster:
        cluster.urls                               one URL per master, slots spread, state ok
    RedisServer(kind="valkey")                     the same with valkey-server (both kinds speak
                                                   the same protocol and read the same options)

Options are redis.conf directives (``maxmemory_policy="allkeys-lru"``: underscores become
dashes). Every wait is bounded; a server that does not come up raises with the end of its log.
Each server runs in its own process group, which ``kill`` and ``stop`` end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from kvtier.apps.ports import free_port

START_S = 15.0  # bound on a server's start, a cluster's agreement, a process's exit


KINDS = ("redis", "valkey")


def redis_server_binary() -> str | None:
    """redis-server, else valkey-server: whichever is installed (None: neither)."""
    return server_binary("redis") or server_binary("valkey")


def server_binary(kind: str) -> str | None:
    """``redis-server`` or ``valkey-server`` on PATH (None: not installed)."""
    if kind not in KINDS:
        raise ValueError(f"server kind must be one of {KINDS}, got {kind!r}")
    return shutil.which(f"{kind}-server")


class RedisServer:
    """One ``redis-server`` or ``valkey-server`` (``kind``; None: whichever is installed, Redis
    first); ``options`` are redis.conf directives, e.g. ``maxmemory="2mb"``."""

    def __init__(
        self,
        *,
        kind: str | None = None,
        cluster: bool = False,
        tls: bool = False,
        **options: str | int,
    ) -> None:
        binary = redis_server_binary() if kind is None else server_binary(kind)
        if binary is None:
            missing = f"{kind}-server is" if kind else "neither redis-server nor valkey-server is"
            raise RuntimeError(f"{missing} installed (see scripts/install-test-servers)")
        self.binary = binary
        self.kind = Path(binary).name.removesuffix("-server")
        self.tls = tls
        self.options = {"save": '""', "appendonly": "no"}
        self.options |= {name.replace("_", "-"): str(value) for name, value in options.items()}
        if cluster:
            bus = str(free_port())  # not port + 10000, which may be past 65535
            self.options |= {"cluster-enabled": "yes", "cluster-node-timeout": "2000",
                             "cluster-port": bus}  # fmt: skip
        self.dir = Path(tempfile.mkdtemp(prefix="kvtier-redis-"))
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        if tls:
            self._make_certificates()

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    @property
    def ca_file(self) -> str:
        """The CA that signed a TLS server's certificate (``redis.tls_ca``)."""
        return str(self.dir / "ca.pem")

    @property
    def password(self) -> str | None:
        return self.options.get("requirepass")

    def client(self, timeout_s: float = 5.0) -> redis.Redis:
        tls = {"ssl": True, "ssl_ca_certs": self.ca_file} if self.tls else {}
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout_s,
                           socket_connect_timeout=timeout_s, password=self.password,
                           **tls)  # type: ignore[arg-type]  # fmt: skip

    def start(self) -> RedisServer:
        conf = self.dir / "redis.conf"
        listen = [f"port {self.port}"]
        if self.tls:
            listen = ["port 0", f"tls-port {self.port}", f"tls-cert-file {self.dir}/server.pem",
                      f"tls-key-file {self.dir}/server.key", f"tls-ca-cert-file {self.ca_file}",
                      "tls-auth-clients no"]  # fmt: skip
        lines = [*listen, "bind 127.0.0.1", f"dir {self.dir}", "protected-mode no",
                 f"cluster-config-file {self.dir}/nodes.conf", f"logfile {self.dir}/redis.log",
                 *(f"{k} {v}" for k, v in self.options.items())]  # fmt: skip
        (self.dir / "nodes.conf").unlink(missing_ok=True)
        conf.write_text("\n".join(lines) + "\n")
        self._process = subprocess.Popen(
            [self.binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self._wait_up()
        return self

    def log(self) -> str:
        """The end of the server's log."""
        try:
            return (self.dir / "redis.log").read_text(errors="replace")[-3000:]
        except OSError as error:
            return f"(no log: {error})"

    def _wait_up(self) -> None:
        deadline = time.monotonic() + START_S
        client = self.client(timeout_s=1.0)
        try:
            while True:
                assert self._process is not None
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log = self.log()
                    self.kill()
                    raise RuntimeError(f"{self.kind}-server on port {self.port} did not start "
                                       f"within {START_S} s; its log:\n{log}")  # fmt: skip
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed machine would (its data is gone)."""
        self._end(signal.SIGKILL)

    @property
    def pid(self) -> int | None:
        """The server's process, the leader of its group, while it runs."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def send(self, how: signal.Signals) -> None:
        """``how`` to the server's process group (SIGSTOP, then SIGCONT: a stall); nothing
        when it is not running."""
        if self.pid is not None:
            os.killpg(self.pid, how)

    def restart(self) -> None:
        """A fresh, empty server on the same port."""
        self.kill()
        self.start()

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def _end(self, how: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, how)
            process.wait(timeout=START_S)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=START_S)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _make_certificates(self) -> None:
        """A CA and a server certificate for 127.0.0.1 signed by it, with ``openssl``."""
        ca, server = self.dir / "ca", self.dir / "server"
        steps = [
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=kvtier test CA", "-keyout", f"{ca}.key", "-out", f"{ca}.pem"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", f"{server}.key", "-out", f"{server}.csr"],
            ["x509", "-req", "-in", f"{server}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{server}.pem", "-extfile", f"{server}.ext"],
        ]  # fmt: skip
        (self.dir / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for step in steps:
            done = subprocess.run(["openssl", *step], capture_output=True, timeout=START_S)
            if done.returncode != 0:
                raise RuntimeError(f"openssl {step[0]} failed: {done.stderr.decode()[-2000:]}")

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedisClusterServers:
    """``masters`` cluster-mode servers, the 16384 slots split between them, state ok."""

    def __init__(self, masters: int = 3, kind: str | None = None) -> None:
        self.servers = [RedisServer(kind=kind, cluster=True) for _ in range(masters)]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def start(self) -> RedisClusterServers:
        try:
            for server in self.servers:
                server.start()
            self._form()
        except BaseException:
            self.close()
            raise
        return self

    def _form(self) -> None:
        clients = [server.client() for server in self.servers]
        step = 16384 // len(clients)
        for i, client in enumerate(clients):
            last = 16383 if i == len(clients) - 1 else (i + 1) * step - 1
            _command(client, "CLUSTER", "ADDSLOTSRANGE", i * step, last)
            _command(client, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)  # distinct, as redis-cli sets
        for server in self.servers[1:]:
            bus = server.options["cluster-port"]
            _command(clients[0], "CLUSTER", "MEET", "127.0.0.1", server.port, bus)
        deadline = time.monotonic() + START_S
        while not all(b"cluster_state:ok" in _command(c, "CLUSTER", "INFO") for c in clients):
            if time.monotonic() > deadline:
                log = self.servers[0].log()
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok within "
                                   f"{START_S} s; a node's log:\n{log}")  # fmt: skip
            time.sleep(0.05)
        for client in clients:
            client.close()

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _command(client: redis.Redis, *args: str | int) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]
