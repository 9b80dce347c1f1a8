"""Real server processes for benchmarks and engine tests: ``kvtier serve`` and ``kvtier proxy``
on 127.0.0.1 with ephemeral ports, each in its own process group and stopped with it; every wait
is bounded.

    serve_command(model, port, extra, args)  the ``kvtier serve`` command line
    alone_command(command)                   the same vLLM server without kvtier (``vllm_alone``)
    launch(command, port, log, env)  -> Server   started, not waited for
    wait_healthy(*servers)                       until each answers /health (or exited: raise)
    post(url, path, body), sample(url, name, **labels), wait(condition, s, what), stop(server)

A server's environment is ``engine_env.server_env()``, then ``launch``'s ``env``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from kvtier.apps.bench.common.engine_env import IN_PROCESS, server_env

START_S = 600.0  # a server's start, on a shared machine
WAIT_S = 120.0
KVTIER = str(Path(sys.executable).with_name("kvtier"))
# ``launch``'s env for a server whose one worker runs in its engine-core process (vLLM's "uni"
# executor), as a one-GPU server runs: a process fewer to start (an import of vLLM fewer). On
# the CPU, vLLM gives even one rank a worker process of its own
# ("mp"), to bind its OpenMP threads, unless told to run it in-process (``IN_PROCESS``); the
# server's engine core is a process apart either way (vLLM's API server always runs it so). Its
# threads are then not bound (``taskset`` still confines them).
WORKER_IN_CORE = dict(IN_PROCESS)


class Server(NamedTuple):
    url: str
    log: Path
    process: subprocess.Popen[bytes]


def serve_command(
    model: Path,
    port: int,
    extra: Mapping[str, Any],
    args: Sequence[str] = (),
    dtype: str = "float32",
    max_model_len: int = 1024,
) -> list[str]:
    """``kvtier serve`` of a local model, served as ``tiny`` (``args``: more vLLM options)."""
    return [
        KVTIER, "serve", str(model), "--kvtier", json.dumps(extra), "--port", str(port),
        "--served-model-name", "tiny", "--dtype", dtype, "--max-model-len", str(max_model_len),
        "--block-size", "32", "--seed", "0", "--enforce-eager",
        "--gpu-memory-utilization", "0.3", *args,
    ]  # fmt: skip


def alone_command(command: Sequence[str]) -> list[str]:
    """``serve_command``'s line as vLLM's own server with no KV connector: the same model and
    vLLM arguments, without ``--kvtier`` (``concurrency/vllm_alone.py``)."""
    if list(command[1:2]) != ["serve"] or command[3] != "--kvtier":
        raise ValueError(f"not a serve_command line: {list(command)[:5]}")
    return [sys.executable, "-m", "kvtier.apps.bench.concurrency.vllm_alone", command[2],
            *command[5:]]  # fmt: skip


def launch(
    command: list[str], port: int, log: Path, env: Mapping[str, str] | None = None
) -> Server:
    """Start ``command`` (listening on ``port``) in its own process group; do not wait."""
    environment = server_env() | dict(env or {})  # a worker process unless WORKER_IN_CORE
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=environment,
            start_new_session=True,
        )  # fmt: skip
    return Server(f"http://127.0.0.1:{port}", log, process)


def wait_healthy(*servers: Server) -> None:
    for server in servers:
        wait(partial(healthy, server), START_S, f"{server.url}/health ({server.log.name})")


def healthy(server: Server) -> bool:
    if server.process.poll() is not None:
        tail = server.log.read_text(errors="replace")[-6000:]
        raise AssertionError(f"{server.log.name} exited with {server.process.returncode}:\n{tail}")
    try:
        with urllib.request.urlopen(server.url + "/health", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def post(
    url: str, path: str, body: Mapping[str, Any] | None = None, timeout: float = WAIT_S
) -> Any:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url + path, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def sample(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples on /metrics whose labels include ``labels``."""
    with urllib.request.urlopen(url + "/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(r"([^{\s]+)(?:\{(.*)\})? (\S+)", line)
        if match is None or match[1] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            total += float(match[3])
    return total


def wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.2)  # a poll interval: the condition is checked again


def stop(server: Server) -> None:
    """SIGTERM to the server's process group (vLLM's engine processes too), then SIGKILL."""
    process = server.process
    for sig, timeout in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(process.pid, sig)  # the group the server leads (start_new_session)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue
