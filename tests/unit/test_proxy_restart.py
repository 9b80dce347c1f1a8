"""``kvtier proxy --reuse-port``: a new proxy takes the port while the old one drains, so a
restart refuses no connection; without it, a second proxy on a taken port is an error."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

from kvtier.apps.bench.common.servers import KVTIER, wait
from kvtier.apps.ports import free_port

START_S = 60.0


def _proxy(port: int, log: Path, *more: str) -> subprocess.Popen[bytes]:
    env = {name: os.environ[name] for name in ("PATH", "HOME")}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [KVTIER, "proxy", "--engine", "http://127.0.0.1:9", "--port", str(port), *more],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip


def _started(log: Path) -> bool:
    return "Application startup complete" in log.read_text(errors="replace")


def _metrics(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return int(answer.status)


def _ended(process: subprocess.Popen[bytes]) -> int:
    try:
        return process.wait(timeout=START_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_a_proxy_restarted_on_its_port_refuses_no_connection(tmp_path: Path) -> None:
    port = free_port()
    old = _proxy(port, tmp_path / "old.log", "--reuse-port")
    new: subprocess.Popen[bytes] | None = None
    try:
        wait(lambda: _started(tmp_path / "old.log"), START_S, "the old proxy to listen")
        new = _proxy(port, tmp_path / "new.log", "--reuse-port")
        wait(lambda: _started(tmp_path / "new.log"), START_S, "the new proxy to listen")
        old.send_signal(signal.SIGTERM)
        assert _ended(old) in (0, -signal.SIGTERM)  # uvicorn ends by the signal it drained on
        assert all(_metrics(port) == 200 for _ in range(20))  # the new one answers them all
    finally:
        for process in (old, new):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                _ended(process)


def test_without_reuse_port_a_second_proxy_on_a_taken_port_is_an_error(tmp_path: Path) -> None:
    port = free_port()
    first = _proxy(port, tmp_path / "first.log")
    try:
        wait(lambda: _started(tmp_path / "first.log"), START_S, "the first proxy to listen")
        second = _proxy(port, tmp_path / "second.log")
        assert _ended(second) != 0
        assert "address already in use" in (tmp_path / "second.log").read_text().lower()
    finally:
        first.send_signal(signal.SIGTERM)
        _ended(first)
