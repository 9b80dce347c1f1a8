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


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``: pid -> its start time (``/proc``'s, field 22)."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            if int(fields[1]) == pid:
                found[int(entry)] = fields[19]
    return found


def _alive(pid: int, started: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"  # the same process, not a zombie


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
