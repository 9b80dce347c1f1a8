"""Helpers of the disk-tier engine tests: engine processes, the tier's files, faults to inject."""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import engine, generate, kvtier_transfer, settle

import kvtier
from kvtier.tiers.base.chunk_format import HEADER_BYTES, ChunkError, verify_file
from kvtier.tiers.disk.names import scan

CHUNK = 64  # tokens per chunk: two engine blocks of 32
JOB = Path(__file__).with_name("disk_job.py")
FORKER = Path(__file__).with_name("job_forker.py")
START_S = 600.0  # the forker's imports (once) and a fork, on a busy 2-core machine


def disk_extra(path: Path, cpu: str = "64MiB", **disk: Any) -> dict[str, Any]:
    """kvtier's extra config with a disk tier in ``path`` (256 MiB unless ``bytes`` is given)."""
    return {
        "cpu_bytes_to_use": cpu,
        "block_size": CHUNK,
        "disk": {"path": str(path), "bytes": "256MiB", **disk},
    }


def disk_run(
    model: Path, tier: Path, token_prompts: list[list[int]], **overrides: Any
) -> tuple[list[list[int]], int]:
    """An in-process engine of ``model`` (engine args ``overrides``) with a disk tier in
    ``tier``: its greedy outputs, and the chunks the tier served; written to disk once idle,
    for the next engine."""
    with engine(model, kv_transfer_config=kvtier_transfer(**disk_extra(tier)), **overrides) as llm:
        outputs = generate(llm, token_prompts)
        settle(llm)
        return outputs, kvtier.stats(llm).tiers["disk"].loaded_chunks


def start_job(
    work: Path,
    name: str,
    model: Path,
    token_prompts: Sequence[list[int]],
    extra: dict[str, Any],
    rounds: int = 1,
    prefix: Sequence[str] = (),
    settle: bool = True,
) -> tuple[Job, Path]:
    """Start ``disk_job.py`` in a new process (``prefix``: a command to run it under).

    Without a ``prefix``, the process is forked from ``job_forker.py`` (vLLM already imported:
    ~10-25 s less per job); with one, or when this process's environment is no longer the one
    the forker started with, it is ``python disk_job.py`` itself."""
    job, out = work / f"{name}.job.json", work / f"{name}.out.json"
    spec = {"model": str(model), "prompts": list(token_prompts), "rounds": rounds}
    job.write_text(json.dumps(spec | {"extra": extra, "settle": settle}))
    log_path = work / f"{name}.log"
    if not prefix:
        forked = _forker().start(job, out, log_path)
        if forked is not None:
            return forked, out
    log = open(log_path, "wb")  # noqa: SIM115  (closed with the process)
    command = [*prefix, sys.executable, str(JOB), str(job), str(out)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=JOB.parent)
    log.close()
    return process, out


def finish_job(process: Job, out: Path, timeout: float = 300) -> Any:
    """Wait for a job; its JSON result, or AssertionError with the end of its log."""
    code = process.wait(timeout=timeout)
    if code != 0 or not out.exists():
        log = out.with_name(out.name.replace(".out.json", ".log")).read_text(errors="replace")
        raise AssertionError(f"engine process exited with {code}:\n{log[-6000:]}")
    return json.loads(out.read_text())


class ForkedJob:
    """A job process forked by the forker: ``wait`` as ``subprocess.Popen.wait``."""

    def __init__(self, forker: Forker, pid: int) -> None:
        self.forker, self.pid = forker, pid

    def wait(self, timeout: float | None = None) -> int:
        return self.forker.wait(self.pid, timeout)


Job = subprocess.Popen[bytes] | ForkedJob


class Forker:
    """``job_forker.py``, started once per pytest process (at its first job) with this process's
    environment; job processes are its children."""

    def __init__(self) -> None:
        self.env = _comparable(os.environ)
        self.process = subprocess.Popen(
            [sys.executable, str(FORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, cwd=JOB.parent,
        )  # fmt: skip
        self.exited: dict[int, int] = {}
        self.buffer = b""
        atexit.register(self.close)

    def start(self, job: Path, out: Path, log: Path) -> ForkedJob | None:
        """Fork a job process; None when the environment changed since the forker started."""
        if _comparable(os.environ) != self.env or self.process.poll() is not None:
            return None
        request = {"job": str(job), "out": str(out), "log": str(log), "cwd": str(JOB.parent),
                   "env": dict(os.environ)}  # fmt: skip
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        started = self._message(START_S)
        return ForkedJob(self, started["pid"])

    def wait(self, pid: int, timeout: float | None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exited:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"forked job {pid}", timeout or 0)
            self._message(left)
        return self.exited[pid]

    def _message(self, timeout: float | None) -> dict[str, Any]:
        """The forker's next message (an exit is also recorded in ``exited``)."""
        assert self.process.stdout is not None
        stdout = self.process.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([stdout], [], [], left)
            if not readable:
                raise subprocess.TimeoutExpired("the job forker", timeout or 0)
            data = os.read(stdout, 1 << 16)
            if not data:
                raise AssertionError(f"the job forker exited with {self.process.wait()}")
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        if "code" in message:
            self.exited[message["pid"]] = message["code"]
        return message

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()  # EOF: it waits for its children, then exits
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


_FORKER: list[Forker] = []


def _forker() -> Forker:
    if not _FORKER:
        _FORKER.append(Forker())
    return _FORKER[0]


# set in this process by pytest from test to test, and by vLLM as an in-process engine starts
# (each job's own engine sets them again as it starts): not a reason to start a job's process
# afresh, which costs a new import of vLLM. Without them here, every job after this process's
# first engine was started afresh.
_CHANGED_BY_TESTS = frozenset({
    "PYTEST_CURRENT_TEST", "VLLM_WORKER_MULTIPROC_METHOD", "LD_PRELOAD", "NUMEXPR_MAX_THREADS",
    "LOCAL_WORLD_SIZE", "VLLM_DIST_IDENT", "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME",
    "VLLM_DISABLE_SHARED_EXPERTS_STREAM", "TORCHINDUCTOR_CPP_DYNAMIC_THREADS", "AITER_SITUV2_A4W4",
})  # fmt: skip


def _comparable(env: Mapping[str, str]) -> dict[str, str]:
    """The environment, less what pytest and vLLM's engines change in this process."""
    return {k: v for k, v in env.items() if k not in _CHANGED_BY_TESTS}


def run_job(*args: Any, **kwargs: Any) -> Any:
    return finish_job(*start_job(*args, **kwargs))


def chunk_files(root: Path) -> set[Path]:
    return {Path(entry.path) for entry, chunk in scan(root) if chunk is not None}


def tier_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def bad_files(root: Path) -> list[Path]:
    """Chunk files that fail verification (``kvtier inspect --verify``)."""
    bad = []
    for path in chunk_files(root):
        try:
            verify_file(path)
        except (ChunkError, OSError):
            bad.append(path)
    return bad


def copy_tier(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- faults ------------------------------------------------------------------------------------


def flip_payload_byte(path: Path, offset: int = 100) -> None:
    with open(path, "r+b") as file:
        file.seek(HEADER_BYTES + offset)
        byte = file.read(1)
        file.seek(HEADER_BYTES + offset)
        file.write(bytes([byte[0] ^ 0x01]))


def truncate(path: Path, size: int | None = None) -> None:
    os.truncate(path, path.stat().st_size - 1 if size is None else size)


def swap_names(a: Path, b: Path) -> None:
    temp = a.with_name(a.name + ".swap")
    a.rename(temp)
    b.rename(a)
    temp.rename(b)
