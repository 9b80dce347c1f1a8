"""A benchmark ended by SIGTERM (``timeout``, a cancelled CI job) stops what it started: ``kvtier
bench chaos`` signalled while its Redis and engines start leaves none of them running, and
exits with 143 (128 + SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from kvtier.apps.bench.common.servers import KVTIER, wait

SERVERS = 5  # Redis and four `kvtier serve`: two engines and a prefill→decode pair


def _stat(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command name (state, parent, ...; the start time at
    19), or None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``: pid -> its start time."""
    stats = {int(entry): _stat(entry) for entry in os.listdir("/proc") if entry.isdigit()}
    return {child: stat[19] for child, stat in stats.items() if stat and int(stat[1]) == pid}


def _alive(pid: int, started: str) -> bool:
    """The same process (its start time) is still there, and not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[19] == started and stat[0] != "Z"


def test_a_benchmark_ended_by_sigterm_stops_its_servers(tmp_path: Path) -> None:
    env = {name: os.environ[name] for name in ("PATH", "HOME")}
    command = [KVTIER, "bench", "chaos", "--quick", "--out", str(tmp_path), "--logs",
               str(tmp_path / "logs")]  # fmt: skip
    bench = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)  # fmt: skip
    started: dict[int, str] = {}

    def servers_started() -> bool:
        started.update(_children(bench.pid))
        return len(started) >= SERVERS

    try:
        wait(servers_started, 60, "the benchmark's servers started")
        bench.send_signal(signal.SIGTERM)
        output, _ = bench.communicate(timeout=300)
        assert bench.returncode == 128 + signal.SIGTERM, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        assert [pid for pid, at in started.items() if _alive(pid, at)] == []
    finally:
        bench.kill()
        bench.wait()
        for pid, at in started.items():  # what a failed run left: its session, then itself
            if _alive(pid, at):
                os.killpg(pid, signal.SIGKILL)
